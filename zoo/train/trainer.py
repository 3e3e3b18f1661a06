"""`zoo.Trainer`: one trainer for every flavor, driven by a task and an optax optimizer."""

from __future__ import annotations

import contextlib

import equinox as eqx
import jax
import optax
from jax.sharding import Mesh
from jaxtyping import PRNGKeyArray

from zoo.data.batches import BatchSource
from zoo.distributed.hosts import is_writer
from zoo.distributed.layout import Layout
from zoo.distributed.rules import Rule
from zoo.host import tune_host_allocator
from zoo.tasks.base import Stats, Task
from zoo.train import evaluation, optim
from zoo.train.history import History
from zoo.train.lock import RunLock
from zoo.train.loop import TrainingDiverged, TrainingRun
from zoo.train.settings import LoopSettings, Outputs
from zoo.train.sharded import require_orbax
from zoo.train.step import resolve_precision, shared_eval_step, shared_train_step

__all__ = ["Trainer", "TrainingDiverged"]


def _loop_field(name: str) -> property:
    """`trainer.NAME`: the loop setting of that name, read-only (before `LoopSettings` these
    were the trainer's own attributes)."""
    return property(lambda self: getattr(self.loop, name), doc=f"`loop.{name}` (read-only)")


class Trainer:
    """Train any zoo model with its task.

    ```python
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(lr=3e-4, warmup=200),
                          loop=zoo.train.LoopSettings(eval_every=500))
    model, history = trainer.fit(model, train_batches, eval_batches=val_batches, steps=2000,
                                 key=jax.random.key(0), outputs=zoo.train.Outputs("runs/gpt"))
    ```

    The task, the optimizer, `precision`, `accumulate` and the mesh make the compiled step:
    trainers equal in these share one. `loop` (`LoopSettings`: how often to log, evaluate and
    checkpoint, how many checkpoints to keep, the progress bar and the loggers) runs around it.

    On many devices (`mesh`) the model, optimizer state and batches are sharded at the `jit`
    boundary; checkpoints are written with orbax (the `distributed` extra), in the background
    while training goes on. On many processes (`zoo.distributed.initialize`) the mesh spans
    every process's devices and is required; every process runs `fit` and process 0 alone
    writes metrics, logs, `state.json` and the final model.

    Args:
        task: what the model learns (a `zoo.tasks.Task`, e.g. `zoo.tasks.LanguageModeling()`).
        optimizer: an optax transformation, best a `zoo.train.adamw(...)` (the default).
        loop: how the loop runs around the step (`LoopSettings`; default `LoopSettings()`).
        precision: "auto" (the default: "bf16" on a GPU or TPU, "fp32" on a CPU), "fp32", or
            "bf16" (bf16 forward/backward, fp32 master weights, loss and softmax in fp32).
        accumulate: split each batch into this many micro-batches (gradient accumulation
            inside the jitted step); the batch size must be a multiple of it.
        mesh: train on many devices: a `jax.sharding.Mesh` or a string like
            `"data=2,fsdp=2,tensor=2"` (see `zoo.distributed`); None: one device.
        rules: partition rules in place of `zoo.distributed.RULES` (with `mesh`).
    """

    def __init__(
        self,
        task: Task,
        optimizer: optim.OptimizerLike | None = None,
        *,
        loop: LoopSettings | None = None,
        precision: str = "auto",
        accumulate: int = 1,
        mesh: Mesh | str | None = None,
        rules: tuple[Rule, ...] | None = None,
    ):
        if not isinstance(task, Task):
            raise TypeError(
                f"task must be a zoo.tasks.Task (e.g. zoo.tasks.LanguageModeling()), "
                f"got {type(task).__name__}"
            )
        if loop is not None and not isinstance(loop, LoopSettings):
            raise TypeError(
                "loop must be a zoo.train.LoopSettings (e.g. LoopSettings(eval_every=500)), "
                f"got {type(loop).__name__}"
            )
        precision = resolve_precision(precision)
        if not isinstance(accumulate, int) or accumulate < 1:
            raise ValueError(f"accumulate must be a positive integer, got {accumulate!r}")
        self.task = task
        self.optimizer = optim.adamw() if optimizer is None else optimizer
        self.loop = loop or LoopSettings()
        self.precision = precision
        self.accumulate = accumulate
        self.layout: Layout | None = None
        if mesh is None and jax.process_count() > 1:
            raise ValueError(
                f"this run has {jax.process_count()} processes and {jax.device_count()} devices "
                'in all: train on a mesh over all of them, e.g. mesh="data=-1" (zoo train '
                "--mesh data=-1); without one each process would train alone"
            )
        if mesh is not None:
            require_orbax()
            self.layout = Layout.of(mesh, rules)
        # the steps check each batch on the host, so that their programs have no host callback
        # and the persistent compilation cache keeps them
        self.train_step = shared_train_step(
            task,
            self.optimizer,
            accumulate=accumulate,
            precision=precision,
            layout=self.layout,
            host_checks=True,
        )
        self.eval_step = shared_eval_step(
            task, precision=precision, layout=self.layout, host_checks=True
        )

    log_every = _loop_field("log_every")
    eval_every = _loop_field("eval_every")
    eval_limit = _loop_field("eval_limit")
    checkpoint_every = _loop_field("checkpoint_every")
    keep = _loop_field("keep")
    progress = _loop_field("progress")
    loggers = _loop_field("loggers")

    def init_optimizer(self, model: eqx.Module) -> optax.OptState:
        """The optimizer state for `model`'s floating-point arrays (sharded on the mesh)."""
        return optim.init_optimizer(self.optimizer, model, self.layout)

    def learning_rate(self, step: int) -> float | None:
        """The learning rate of update number `step` (1-based), if the optimizer exposes it."""
        return optim.learning_rate(self.optimizer, step)

    def evaluate(
        self, model: eqx.Module, batches: BatchSource, *, limit: int | None = None
    ) -> evaluation.Evaluation:
        """Loss, metric and token count over `batches` (the first `limit`), without dropout."""
        return evaluation.evaluate(self.task, self.eval_step, model, batches, limit=limit)

    def summarise(self, stats: Stats) -> evaluation.Summary:
        """Host floats of summed statistics: loss, the task's metric and its name."""
        return evaluation.summarise(self.task, stats)

    def fit(
        self,
        model: eqx.Module,
        train_batches: BatchSource,
        *,
        steps: int,
        key: PRNGKeyArray,
        eval_batches: BatchSource | None = None,
        outputs: Outputs | None = None,
        resume: bool = False,
    ) -> tuple[eqx.Module, History]:
        """Train for `steps` optimizer updates in total; returns the trained model and history.

        The model passed in is not modified. One run at a time writes into a folder: a second
        `fit` into folders another run holds is refused.

        Args:
            model: the model to train (a copy is trained).
            train_batches: step `s` trains on `train_batches.batch(s)`.
            steps: optimizer updates in all, those done before a resume included.
            key: the run's base dropout key (step `s` folds in `s`).
            eval_batches: evaluated every `loop.eval_every` steps and at the end.
            outputs: where the run writes: checkpoints, `metrics.jsonl`, the final model (with
                its tokenizer) and `curves.png` (`Outputs`; None: nothing is written).
            resume: continue from the newest checkpoint in `outputs.checkpoint_dir` exactly
                where it stopped (model, optimizer, RNG, data position).
        """
        if outputs is not None and not isinstance(outputs, Outputs):
            raise TypeError(
                'outputs must be a zoo.train.Outputs (e.g. Outputs("runs/gpt")), got '
                f"{type(outputs).__name__}"
            )
        outputs = outputs or Outputs()
        if jax.default_backend() == "cpu":
            # reuse freed step memory (see zoo.host); ZOO_MALLOC_TOP_PAD_MB=0 opts out
            tune_host_allocator()
        # one run at a time per directory; with many processes process 0 holds the lock for all
        if is_writer():
            lock: contextlib.AbstractContextManager = RunLock(outputs.checkpoints, outputs.folder)
        else:
            lock = contextlib.nullcontext()
        with lock:
            run = TrainingRun(
                self,
                model,
                train_batches,
                steps=steps,
                key=key,
                eval_batches=eval_batches,
                outputs=outputs,
                resume=resume,
            )
            return run.train()
