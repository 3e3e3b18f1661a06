"""What one `Trainer.fit` call works with, checked before anything compiles.

`RunSetup` is what a run (`zoo.train.loop.TrainingRun`) takes from its `zoo.Trainer`: the task,
the compiled steps and the options. `check_inputs` refuses what would fail or do harm later:
no steps or batches, a batch the task or the mesh cannot take, checkpoints that a fresh run
would mix with, a saved model a run would overwrite, loggers with nowhere to write.
`check_folders` is the part about the folders alone, which `zoo train` also runs before it
records a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast, runtime_checkable

import equinox as eqx

from zoo.data.batches import Batch, BatchSource, OnPolicySource
from zoo.distributed.layout import Layout
from zoo.serialize import CONFIG_FILE, WEIGHTS_FILE
from zoo.tasks.base import Task
from zoo.train.checkpoint_folder import latest_checkpoint
from zoo.train.loggers import LoggerSpec
from zoo.train.optim import OptimizerLike
from zoo.train.settings import LoopSettings, Outputs
from zoo.train.spelling import resume_spelling
from zoo.train.step import EvalStep, TrainStep


@runtime_checkable
class RunSetup(Protocol):
    """What a run takes from its `zoo.Trainer`: the task, the compiled steps and the options."""

    task: Task
    optimizer: OptimizerLike
    layout: Layout | None  # None: one device
    train_step: TrainStep
    eval_step: EvalStep
    precision: str
    accumulate: int
    loop: LoopSettings


def check_inputs(
    setup: RunSetup,
    model: eqx.Module,
    train_batches: BatchSource,
    eval_batches: BatchSource | None,
    *,
    steps: int,
    outputs: Outputs,
    resume: bool,
) -> None:
    """Raise a ValueError that says what to change when `fit` could not do what is asked.

    Args:
        setup: the trainer's task, steps and options.
        model: the model to train.
        train_batches: the training batches (the first is checked).
        eval_batches: the evaluation batches, or None (the first is checked).
        steps: optimizer updates in all.
        outputs: where the run writes.
        resume: whether the run continues from a checkpoint.
    """
    setup.task.check_model(model)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if len(train_batches) == 0:
        raise ValueError("train_batches is empty: it yields no batches (len 0); check the data")
    if not isinstance(train_batches, OnPolicySource):  # sampled by the model: checked each step
        check_batch(setup, train_batches.batch(0), model)
    if eval_batches is not None:
        if len(eval_batches) == 0:
            raise ValueError("eval_batches is empty: it yields no batches (len 0)")
        setup.task.check_batch(eval_batches.batch(0), model)
    check_folders(outputs, resume=resume)
    loggers = cast(tuple[LoggerSpec, ...], setup.loop.loggers)  # a tuple once checked
    if outputs.folder is None and any(isinstance(logger, str) for logger in loggers):
        raise ValueError(
            f"loggers {list(loggers)} write into out_dir: pass out_dir (or checkpoint_dir)"
        )


def check_folders(outputs: Outputs, *, resume: bool) -> None:
    """Refuse a fresh run into checkpoints (it would mix with them), a run that would overwrite
    a saved model, and `resume` with no checkpoint folder."""
    checkpoint_dir, out_dir = outputs.checkpoints, outputs.folder
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir (where the checkpoints are)")
    existing = None if checkpoint_dir is None else latest_checkpoint(checkpoint_dir)
    if existing is not None and not resume:
        raise ValueError(
            f"{checkpoint_dir} already holds checkpoints (newest: {existing.name}); "
            f"continue that run with {resume_spelling()} or train into a new "
            "directory"
        )
    saved_model = saved_model_files(out_dir)
    if existing is None and saved_model:
        raise ValueError(
            f"{out_dir} already holds a saved model ({', '.join(saved_model)}) and no "
            "checkpoint to resume from: training would overwrite it. Train into a new "
            "directory; to start from that model, load it (zoo train --init DIR) and "
            "write the run elsewhere"
        )


def saved_model_files(out_dir: Path | None) -> list[str]:
    """The files of a model saved with `zoo.save` in `out_dir`, which a run would replace."""
    if out_dir is None:
        return []
    return [name for name in (CONFIG_FILE, WEIGHTS_FILE) if (out_dir / name).is_file()]


def check_batch(setup: RunSetup, batch: Batch, model: eqx.Module) -> None:
    """The task must take `batch`, its rows must split over the mesh and into micro-batches."""
    setup.task.check_batch(batch, model)
    if setup.layout is not None:
        setup.layout.check_batch(batch)
    size = len(next(iter(batch.values())))
    if size % setup.accumulate != 0:
        raise ValueError(
            f"batch size {size} is not a multiple of accumulate={setup.accumulate}; "
            "choose a batch size that splits into equal micro-batches"
        )
