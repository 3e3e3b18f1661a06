"""`zoo.Trainer`: one trainer for every flavor, driven by a task and an optax optimizer."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import equinox as eqx
import jax
import optax
from jax.sharding import Mesh
from jaxtyping import PRNGKeyArray

from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.distributed.hosts import is_writer
from zoo.distributed.layout import Layout
from zoo.distributed.rules import Rule
from zoo.host import tune_host_allocator
from zoo.tasks.base import Stats, Task
from zoo.train import evaluation, optim
from zoo.train.history import History
from zoo.train.lock import RunLock
from zoo.train.loggers import LoggerSpec, check_loggers
from zoo.train.loop import TrainingDiverged, TrainingRun
from zoo.train.sharded import require_orbax
from zoo.train.step import resolve_precision, shared_eval_step, shared_train_step

__all__ = ["Trainer", "TrainingDiverged"]


class Trainer:
    """Train any zoo model with its task.

    ```python
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), optimizer=zoo.train.adamw(lr=3e-4, warmup=200))
    model, history = trainer.fit(model, train_batches, eval_batches=val_batches, steps=2000,
                                 checkpoint_dir="runs/gpt", key=jax.random.key(0))
    ```

    Options:
    - `precision`: "auto" (the default: "bf16" on a GPU or TPU, "fp32" on a CPU), "fp32", or
      "bf16" (bf16 forward/backward, fp32 master weights, loss and softmax in fp32).
    - `accumulate`: split each batch into this many micro-batches (gradient accumulation inside
      the jitted step); the batch size must be a multiple of it.
    - `log_every`: steps per train row in the history and `metrics.jsonl`; also how often the
      loss is checked for NaN/inf (a host sync).
    - `eval_every`: steps between evaluations (None: only at the end); `eval_limit`: at most
      this many eval batches per evaluation (None: all of `len(eval_batches)`).
    - `checkpoint_every`: steps between checkpoints (None: only at the end and on Ctrl-C or
      SIGTERM); `keep`: how many checkpoints to keep.
    - `progress`: show a tqdm bar (only on a terminal, and only in process 0 of many).
    - `loggers`: also send the metrics rows to "tensorboard" and/or "wandb" (in `out_dir`; the
      `tensorboard` / `wandb` extras), or to objects with `log(row)` and `close()`; see
      `zoo.train.loggers`.
    - `mesh`: train on many devices, a `jax.sharding.Mesh` or a string like
      `"data=2,fsdp=2,tensor=2"` (see `zoo.distributed`); `rules` replaces the partition rules
      (`zoo.distributed.RULES`). The model, optimizer state and batches are sharded at the
      `jit` boundary; checkpoints are written with orbax (the `distributed` extra), in the
      background while training goes on. On many processes (`zoo.distributed.initialize`) the
      mesh spans every process's devices and is required; every process runs `fit` and process
      0 alone writes metrics, logs, `state.json` and the final model.
    """

    def __init__(
        self,
        task: Task,
        optimizer: optim.OptimizerLike | None = None,
        *,
        precision: str = "auto",
        accumulate: int = 1,
        log_every: int = 10,
        eval_every: int | None = None,
        eval_limit: int | None = None,
        checkpoint_every: int | None = None,
        keep: int = 3,
        progress: bool = True,
        loggers: LoggerSpec | Iterable[LoggerSpec] = (),
        mesh: Mesh | str | None = None,
        rules: tuple[Rule, ...] | None = None,
    ):
        if not isinstance(task, Task):
            raise TypeError(
                f"task must be a zoo.tasks.Task (e.g. zoo.tasks.LanguageModeling()), "
                f"got {type(task).__name__}"
            )
        precision = resolve_precision(precision)
        for name, value in (("accumulate", accumulate), ("log_every", log_every), ("keep", keep)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name, optional in (
            ("eval_every", eval_every),
            ("eval_limit", eval_limit),
            ("checkpoint_every", checkpoint_every),
        ):
            if optional is not None and (not isinstance(optional, int) or optional < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {optional!r}")
        self.task = task
        self.optimizer = optim.adamw() if optimizer is None else optimizer
        self.precision = precision
        self.accumulate = accumulate
        self.log_every = log_every
        self.eval_every = eval_every
        self.eval_limit = eval_limit
        self.checkpoint_every = checkpoint_every
        self.keep = keep
        self.progress = progress
        self.loggers = check_loggers(loggers)
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
        self.train_step = shared_train_step(
            task, self.optimizer, accumulate=accumulate, precision=precision, layout=self.layout
        )
        self.eval_step = shared_eval_step(task, precision=precision, layout=self.layout)

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
        checkpoint_dir: str | os.PathLike | None = None,
        out_dir: str | os.PathLike | None = None,
        resume: bool = False,
        tokenizer: Tokenizer | None = None,
        plot: bool = False,
    ) -> tuple[eqx.Module, History]:
        """Train for `steps` optimizer updates in total; returns the trained model and history.

        Step `s` trains on `train_batches.batch(s)`. With `checkpoint_dir`, checkpoints go there
        (every `checkpoint_every` steps, at the end, and on Ctrl-C or SIGTERM); `resume=True`
        continues from the newest one exactly where it stopped (model, optimizer, RNG, data position).
        `out_dir` (default: `checkpoint_dir`) receives `metrics.jsonl`, the final model saved
        with `zoo.save` (plus `tokenizer`) and, with `plot=True`, `curves.png`. The model
        passed in is not modified.
        """
        if jax.default_backend() == "cpu":
            # reuse freed step memory (see zoo.host); ZOO_MALLOC_TOP_PAD_MB=0 opts out
            tune_host_allocator()
        out_dir = checkpoint_dir if out_dir is None else out_dir
        # one run at a time per directory; with many processes process 0 holds the lock for all
        lock = RunLock(checkpoint_dir, out_dir) if is_writer() else contextlib.nullcontext()
        with lock:
            run = TrainingRun(
                self,
                model,
                train_batches,
                steps=steps,
                key=key,
                eval_batches=eval_batches,
                checkpoint_dir=checkpoint_dir,
                out_dir=out_dir,
                resume=resume,
                tokenizer=tokenizer,
                plot=plot,
            )
            return run.train()
