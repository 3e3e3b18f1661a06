"""One call of `Trainer.fit`: checks, resume, the step loop, logging, checkpoints, export.

A `TrainingRun` reads its trainer's settings and compiled steps through `RunSetup` (what a
`zoo.Trainer` holds, `zoo.train.run_setup`), and stops with `TrainingDiverged` when the loss or
the weights go bad.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray, PyTree

from zoo.data.batches import Batch, BatchSource, draw_batch
from zoo.distributed.hosts import gather, is_writer
from zoo.distributed.mesh import mesh_string
from zoo.progress import Progress
from zoo.serialize import model_config_dict
from zoo.tasks.base import Stats
from zoo.train import checkpoint as ckpt
from zoo.train.ahead import compile_ahead
from zoo.train.evaluation import Summary, evaluate, summarise
from zoo.train.frozen import FrozenArrays, frozen_arrays, frozen_extra
from zoo.train.history import History, MetricsLog, Row, clean
from zoo.train.interrupts import HeldInterrupts, Terminated
from zoo.train.loggers import Logger, LoggerSpec, open_loggers
from zoo.train.optim import init_optimizer, learning_rate
from zoo.train.run_setup import RunSetup, check_batch, check_inputs
from zoo.train.settings import Outputs
from zoo.train.sharded import ShardedWriter
from zoo.train.spelling import resume_spelling
from zoo.train.step import StepOutput

# the run's settings, kept in each checkpoint and given to experiment loggers
Settings = dict[str, str | int]


class TrainingDiverged(FloatingPointError):
    """The loss or the gradient became NaN or infinite; `step` names the update."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step

    @classmethod
    def at(cls, step: int, loss: float, grad_norm: float, kept: Path | None) -> TrainingDiverged:
        """The error for update `step`; `kept` is the last good checkpoint (or None)."""
        return cls._stopped(step, f"the loss is {loss} and the gradient norm {grad_norm}", kept)

    @classmethod
    def weights(cls, step: int, kept: Path | None) -> TrainingDiverged:
        """Update `step` left non-finite weights (its loss, computed before it, was finite)."""
        return cls._stopped(step, "the weights after this update are not finite (NaN or inf)", kept)

    @classmethod
    def _stopped(cls, step: int, what: str, kept: Path | None) -> TrainingDiverged:
        if kept is not None:
            saved = f"The last good checkpoint is kept: {kept}."
        else:
            saved = "No checkpoint was saved (pass checkpoint_dir to keep them)."
        return cls(
            f"training stopped at step {step}: {what}. {saved} Lower the learning rate, "
            "lengthen the warmup, keep gradient clipping on, or train in fp32.",
            step,
        )


def _fresh_copy(model: eqx.Module) -> eqx.Module:
    """The step donates the model's buffers; train on a copy so the caller's model survives."""
    return jax.tree_util.tree_map(
        lambda a: jnp.array(a, copy=True) if eqx.is_array(a) else a, model
    )


def _shape_signature(batch: Batch) -> tuple:
    return tuple(sorted((name, tuple(value.shape)) for name, value in batch.items()))


class TrainingRun:
    """The state of one `fit` call. `train()` runs it and returns (model, history).

    Args:
        trainer: the trainer's task, compiled steps and options (`RunSetup`).
        model: the model to train (a copy is trained, or placed on the mesh).
        train_batches: step `s` trains on `train_batches.batch(s)`.
        steps: optimizer updates in all.
        key: the run's base dropout key.
        eval_batches: evaluated every `eval_every` steps and at the end (or None).
        outputs: where the run writes (`Outputs`).
        resume: continue from the newest checkpoint of `outputs.checkpoint_dir`.
    """

    def __init__(
        self,
        trainer: RunSetup,
        model: eqx.Module,
        train_batches: BatchSource,
        *,
        steps: int,
        key: PRNGKeyArray,
        eval_batches: BatchSource | None,
        outputs: Outputs,
        resume: bool,
    ):
        self.trainer = trainer
        self.loop = trainer.loop
        self.task = trainer.task
        self.train_batches = train_batches
        self.eval_batches = eval_batches
        self.steps = steps
        self.checkpoint_dir = outputs.checkpoints
        self.out_dir = outputs.folder
        self.tokenizer = outputs.tokenizer
        self.chat_template = outputs.chat_template_text
        self.plot = outputs.plot
        check_inputs(trainer, model, train_batches, eval_batches, steps=steps, outputs=outputs,
                     resume=resume)  # fmt: skip
        layout = trainer.layout  # None: one device, else the mesh and its partition rules
        self.model = _fresh_copy(model) if layout is None else layout.place(model)
        self.opt_state: PyTree = init_optimizer(trainer.optimizer, self.model, layout)
        self.key = key
        self.start = 0
        self.last_checkpoint: Path | None = None
        # with many processes, process 0 alone writes the files the run shares
        self.writes = is_writer()
        self.arrays_writer: ShardedWriter | None = None  # on a mesh, made by the first save
        # the arrays the optimizer leaves alone, left out of checkpoints (zoo.train.frozen)
        self.frozen: FrozenArrays | None = None
        if self.checkpoint_dir is not None:
            self.frozen = frozen_arrays(trainer.optimizer, self.model)
        if resume:
            self._resume()
        self.log = MetricsLog(
            self.out_dir, resume_at=self.start if resume else None, write=self.writes
        )
        self.history = History(rows=list(self.log.previous))
        self.done = self.start
        self.pending: list[tuple[int, StepOutput, int]] = []  # (step, output, tokens read)
        self.shapes: set[tuple] = set()
        self.train_seconds = 0.0
        self.train_tokens = 0
        self.untimed_tokens = 0  # tokens of the step that compiled: not in the throughput
        self.compile_seconds = 0.0
        self.clock = time.perf_counter()
        self.last_eval = self.last_saved = -1
        self.interrupts = HeldInterrupts()
        self.loggers: list[Logger] = []
        if self.last_checkpoint is not None:  # resumed: that state is saved and maybe evaluated
            self.last_saved = self.start
            if any(r["split"] == "eval" and r["step"] == self.start for r in self.history.rows):
                self.last_eval = self.start

    # -- before the first step ------------------------------------------------------------------

    def _resume(self) -> None:
        assert self.checkpoint_dir is not None  # checked by check_inputs
        found = ckpt.list_checkpoints(self.checkpoint_dir)
        if not found:
            warnings.warn(
                f"no checkpoint in {self.checkpoint_dir}: starting from step 0", stacklevel=4
            )
            return
        saved = ckpt.load_newest_intact(
            found, model=self.model, opt_state=self.opt_state, layout=self.trainer.layout
        )
        if saved.meta.get("train_batches") not in (None, len(self.train_batches)):
            warnings.warn(
                f"the training data has {len(self.train_batches)} batches per epoch but the "
                f"checkpoint was trained with {saved.meta['train_batches']}: the batches after "
                "resuming differ from those of the original run",
                stacklevel=4,
            )
        self.model, self.opt_state, self.key = saved.model, saved.opt_state, saved.key
        self.start = saved.data_position
        self.last_checkpoint = saved.path

    # -- the loop -------------------------------------------------------------------------------

    def train(self) -> tuple[eqx.Module, History]:
        loop = self.loop
        progress = Progress(
            total=self.steps,
            initial=self.start,
            enabled=loop.progress and self.writes,
            description="train",
            unit="step",
        )
        self.progress = progress
        started = time.perf_counter()
        # Ctrl-C and SIGTERM wait for the step or checkpoint write in progress (see interrupts).
        with self.interrupts as interrupts:
            try:
                if self.writes:
                    self.loggers = open_loggers(
                        cast(tuple[LoggerSpec, ...], loop.loggers),  # a tuple once checked
                        self.out_dir,
                        resumed_from=self.start,
                        config=self._logged_config(),
                    )
                for step in range(self.start, self.steps):
                    interrupts.check()
                    self._one_step(step)
                    interrupts.check()
                    progress.advance()
                    if self.done % loop.log_every == 0:
                        self.flush()
                    if loop.eval_every and self.done % loop.eval_every == 0:
                        self.evaluate()
                    if loop.checkpoint_every and self.done % loop.checkpoint_every == 0:
                        self.save()
                    for callback in loop.callbacks:
                        if self.done % callback.every == 0:
                            callback(self.done, self.model)
                self.flush()
                if self.last_eval != self.done:
                    self.evaluate()
                if self.last_saved != self.done:
                    self.save()
                self._wait_for_checkpoint()
                interrupts.check()
            except KeyboardInterrupt as interrupt:
                self._save_on_interrupt(interrupt)
                raise
            except BaseException:
                self._wait_for_checkpoint(quiet=True)  # the error that stopped the run comes first
                raise
            finally:
                progress.close()
                for logger in self.loggers:
                    logger.close()
            self._finish(time.perf_counter() - started)
            interrupts.check()  # a signal during the export: everything is saved, stop now
        return self.model, self.history

    def _one_step(self, step: int) -> None:
        batch = draw_batch(self.train_batches, step, self.model, self.key)
        check_batch(self.trainer, batch, self.model)
        signature = _shape_signature(batch)
        # A bucketed source (one padded length per bucket) compiles once per bucket by design.
        expected_shapes = max(len(getattr(self.train_batches, "lengths", ())), 1)
        if signature not in self.shapes and len(self.shapes) >= expected_shapes:
            warnings.warn(
                f"step {step + 1}: new batch shapes {dict(signature)} make XLA compile the step "
                f"again (seen before: {[dict(s) for s in self.shapes]}); pad batches to fixed "
                "shapes so the step compiles once",
                stacklevel=4,
            )
        self.shapes.add(signature)
        tokens = self.task.num_tokens(batch)
        first = step == self.start
        if first:  # every bucket's step compiles now, side by side (zoo.train.ahead)
            compile_ahead(
                self.trainer.train_step,
                self.model,
                self.opt_state,
                self.train_batches,
                self.key,
                (step, self.steps),
            )
        self.model, self.opt_state, output = self.trainer.train_step(
            self.model, self.opt_state, batch, self.key, step
        )
        self.done = step + 1
        if first:  # exclude compilation from the throughput
            jax.block_until_ready(output)
            now = time.perf_counter()
            self.compile_seconds = now - self.clock
            self.clock = now
            self.untimed_tokens = tokens
        self.pending.append((self.done, output, tokens))

    def flush(self) -> None:
        """Fetch the pending step outputs: check them for NaN/inf and write one train row."""
        if not self.pending:
            return
        steps, outputs, tokens = zip(*self.pending, strict=True)
        self.pending = []
        host = jax.device_get(list(outputs))
        for step, output in zip(steps, host, strict=True):
            loss, grad_norm = float(output.stats.loss), float(output.grad_norm)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                raise TrainingDiverged.at(step, loss, grad_norm, self.last_checkpoint)
        total = Stats.zero()
        for output in host:
            total = total + output.stats
        now = time.perf_counter()
        elapsed, self.clock = now - self.clock, now
        self.train_seconds += elapsed
        timed, self.untimed_tokens = sum(tokens) - self.untimed_tokens, 0
        self.train_tokens += timed
        summary = summarise(self.task, total)
        rate = timed / elapsed if timed and elapsed > 0 else None
        lr = learning_rate(self.trainer.optimizer, steps[-1])
        self._record("train", steps[-1], summary, rate, lr, tokens=sum(tokens))
        self.progress.show(loss=f"{summary['loss']:.4f}", tok_s=f"{rate or 0:,.0f}")

    def _record(
        self,
        split: str,
        step: int,
        summary: Summary,
        rate: float | None,
        lr: float | None,
        *,
        tokens: int,
    ) -> None:
        row: Row = {
            "step": step,
            "split": split,
            "loss": clean(summary["loss"]),
            "metric": clean(summary["metric"]),
            "metric_name": summary["metric_name"],
            "tokens_per_s": None if rate is None else round(rate, 1),
            "lr": None if lr is None else clean(lr),
            "tokens": tokens,
            "scored": summary["scored"],
        }
        if summary["metrics"]:
            row["metrics"] = {name: clean(value) for name, value in summary["metrics"].items()}
        self.history.rows.append(row)
        self.log.write(row)
        for logger in self.loggers:
            logger.log(row)

    def evaluate(self) -> None:
        self.flush()
        self.last_eval = self.done
        if self.eval_batches is None:
            return
        started = time.perf_counter()
        trainer = self.trainer
        with self.interrupts.immediate():  # evaluation donates nothing: stop at once
            summary = evaluate(trainer.task, trainer.eval_step, self.model, self.eval_batches,
                               limit=self.loop.eval_limit)  # fmt: skip
        elapsed = time.perf_counter() - started
        rate = summary["tokens"] / elapsed if elapsed > 0 else None
        self._record("eval", self.done, summary, rate, None, tokens=summary["tokens"])
        self.clock = time.perf_counter()  # evaluation time is not training time

    def save(self) -> None:
        self.flush()  # never save a state whose loss was not checked
        # A step's loss is computed before its update: check the updated weights too.
        if not ckpt.all_finite(self.model):
            self._wait_for_checkpoint(quiet=True)  # the last good one, still being written
            raise TrainingDiverged.weights(self.done, self.last_checkpoint)
        if self.checkpoint_dir is None:
            self.last_saved = self.done
            return
        extra = frozen_extra(self._settings(), self.frozen)
        if self.trainer.layout is None:
            self.last_checkpoint = ckpt.save_checkpoint(
                self.checkpoint_dir,
                step=self.done,
                model=self.model,
                opt_state=self.opt_state,
                key=self.key,
                extra=extra,
                keep=self.loop.keep,
            )
        else:  # the arrays are in host memory now; they reach the disk while training goes on
            if self.arrays_writer is None:
                self.arrays_writer = ShardedWriter(self.checkpoint_dir, keep=self.loop.keep)
            self.last_checkpoint = self.arrays_writer.save(
                step=self.done,
                model=self.model,
                opt_state=self.opt_state,
                key=self.key,
                extra=extra,
            )
        # Only now: a write cut short (a second Ctrl-C) is written again by _save_on_interrupt.
        self.last_saved = self.done
        self.clock = time.perf_counter()

    def _wait_for_checkpoint(self, *, quiet: bool = False) -> None:
        """Wait until a checkpoint written in the background is published (on a mesh).

        Its failure is raised, or with `quiet` (another error is on its way) only warned about."""
        if self.arrays_writer is None:
            return
        writer, self.arrays_writer = self.arrays_writer, None
        try:
            writer.close()
        except OSError as error:
            if not quiet:
                raise
            warnings.warn(str(error), stacklevel=3)

    def _save_on_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        if self.checkpoint_dir is None or self.last_saved == self.done:
            self._wait_for_checkpoint(quiet=True)
            return
        try:
            self.save()
            self._wait_for_checkpoint()
        except RuntimeError as error:  # interrupted inside a step: its inputs were donated
            warnings.warn(f"could not save on interrupt ({error})", stacklevel=3)
            self._wait_for_checkpoint(quiet=True)
            return
        except OSError as error:  # the interrupt goes on; say what was not saved
            warnings.warn(f"could not save on interrupt ({error})", stacklevel=3)
            return
        cause = "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"
        print(
            f"{cause}: saved {self.last_checkpoint}; continue with {resume_spelling()}",
            file=sys.stderr,
        )

    def _settings(self) -> Settings:
        """The run's settings, kept in each checkpoint and given to experiment loggers."""
        settings: Settings = {
            "task": repr(self.task),
            "precision": self.trainer.precision,
            "accumulate": self.trainer.accumulate,
            "train_batches": len(self.train_batches),
        }
        if self.trainer.layout is not None:
            settings["mesh"] = mesh_string(self.trainer.layout.mesh)
        return settings

    def _logged_config(self) -> dict[str, object]:
        """What an experiment logger records: model config, run settings, steps."""
        return {
            **model_config_dict(self.model),
            **self._settings(),
            "steps": self.steps,
            "resumed_from": self.start,
        }

    def _finish(self, wall_seconds: float) -> None:
        trained = self.done - self.start
        rate = self.train_tokens / self.train_seconds if self.train_tokens else None
        self.history.summary = {
            "steps": self.done,
            "resumed_from": self.start,
            "wall_seconds": round(wall_seconds, 2),
            "compile_seconds": round(self.compile_seconds, 2),
            "tokens_per_s": None if rate is None else round(rate, 1),
            "final_train": self.history.last("train") if trained else None,
            "final_eval": self.history.last("eval"),
            "checkpoint": None if self.last_checkpoint is None else str(self.last_checkpoint),
        }
        if self.out_dir is None:
            return
        model = self.model
        if self.trainer.layout is not None:  # every process takes part in the gather
            arrays, static = eqx.partition(model, eqx.is_array)
            model = eqx.combine(gather(arrays), static)
        if self.writes:
            from zoo.serialize import save

            save(model, self.out_dir, tokenizer=self.tokenizer,
                 extra={"training": self.history.summary})  # fmt: skip
            if self.chat_template is not None:  # after the tokenizer's own template
                from zoo.files import write_text_atomic

                write_text_atomic(self.out_dir / "chat_template.jinja", self.chat_template)
            if self.plot:
                from zoo.train.plot import plot_history

                plot_history(self.history, self.out_dir / "curves.png")
