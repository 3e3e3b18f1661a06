"""Experiment loggers: every row of `metrics.jsonl` also goes to TensorBoard or W&B.

`zoo.Trainer(task, loop=LoopSettings(loggers=["tensorboard", "wandb"]))` (`zoo train --log
tensorboard --log wandb`) opens them for each `fit` that has an `out_dir`:

- `"tensorboard"`: event files in `out_dir/tensorboard/`, written by tensorboardX (no
  TensorFlow); view them with `tensorboard --logdir out_dir`. On resume, the steps after the
  checkpoint (redone by the resumed run) are purged, as they are from `metrics.jsonl`.
- `"wandb"`: a Weights & Biases run in `out_dir/wandb/`, offline unless `WANDB_MODE` says
  otherwise (no account needed; `wandb sync` uploads it later); the project is `WANDB_PROJECT`
  or "zoo", the run is named after `out_dir`, its config holds the model config and trainer
  settings.

Each metrics row becomes scalars named `SPLIT/loss`, `SPLIT/METRIC` (e.g. `eval/perplexity`),
`SPLIT/tokens_per_s` and `train/lr`, at the row's step. An object with `log(row)` and
`close()` (`Logger`) can be passed too. The packages are optional extras; a missing one is
named with the `pip install` that brings it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from zoo.extras import pip_install
from zoo.train.history import Row

# name -> (the package it needs, the zoo extra that installs it)
LOGGERS = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}


@runtime_checkable
class Logger(Protocol):
    """Receives each metrics row as it is written; `close()` ends the run's logging."""

    def log(self, row: Row) -> None: ...

    def close(self) -> None: ...


# a logger asked for by name ("tensorboard", "wandb") or given as an object
LoggerSpec = str | Logger


def scalars(row: Row) -> dict[str, float]:
    """The numbers of one metrics row, named `split/quantity`; missing values are left out."""
    split = row["split"]
    named = {
        f"{split}/loss": row["loss"],
        f"{split}/{row['metric_name']}": row["metric"],
        f"{split}/tokens_per_s": row["tokens_per_s"],
        f"{split}/lr": row["lr"],
    }
    named |= {f"{split}/{name}": value for name, value in row.get("metrics", {}).items()}
    # non-finite values are strings in metrics.jsonl ("nan"); float() reads them back
    return {name: float(value) for name, value in named.items() if value is not None}


def _require(name: str) -> str:
    """The module logger `name` needs; an ImportError naming the extra when it is missing."""
    module, extra = LOGGERS[name]
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"logging to {name} needs the {module} package: {pip_install(extra)}")
    return module


def check_loggers(loggers: LoggerSpec | Iterable[LoggerSpec]) -> tuple[LoggerSpec, ...]:
    """`loggers` as a tuple of known names and `Logger` objects; missing packages raise now."""
    if isinstance(loggers, str | Logger):
        loggers = (loggers,)
    checked = tuple(loggers)
    for logger in checked:
        if isinstance(logger, str):
            if logger not in LOGGERS:
                raise ValueError(
                    f"unknown logger {logger!r}; choose from {sorted(LOGGERS)} or pass an "
                    "object with log(row) and close()"
                )
            _require(logger)
        elif not isinstance(logger, Logger):
            raise TypeError(
                f"a logger must be one of {sorted(LOGGERS)} or have log(row) and close(), "
                f"got {type(logger).__name__}"
            )
    return checked


class TensorBoardLogger:
    """Scalars as TensorBoard event files in `directory` (tensorboardX, no TensorFlow)."""

    def __init__(self, directory: str | os.PathLike, *, purge_step: int | None = None):
        writer_class = importlib.import_module(_require("tensorboard")).SummaryWriter
        self.writer = writer_class(logdir=str(directory), purge_step=purge_step, flush_secs=10)

    def log(self, row: Row) -> None:
        for name, value in scalars(row).items():
            self.writer.add_scalar(name, value, global_step=row["step"])

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run under `directory/wandb/`, offline unless WANDB_MODE is set."""

    def __init__(self, directory: str | os.PathLike, *, name: str | None, config: dict):
        wandb = importlib.import_module(_require("wandb"))
        self.run = wandb.init(
            dir=str(directory),
            project=os.environ.get("WANDB_PROJECT", "zoo"),
            name=name,
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),
            # console="off": W&B must not wrap stdout (zoo train --json prints JSON there)
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, row: Row) -> None:
        self.run.log(scalars(row), step=row["step"])

    def close(self) -> None:
        self.run.finish()


def open_loggers(
    loggers: tuple[LoggerSpec, ...], out_dir: Path | None, *, resumed_from: int, config: dict
) -> list[Logger]:
    """Start the loggers of one `fit`: names become `TensorBoardLogger` / `WandbLogger`."""
    opened: list[Logger] = []
    for logger in loggers:
        if not isinstance(logger, str):
            opened.append(logger)
        elif out_dir is None:
            raise ValueError(f"the {logger} logger needs out_dir (or checkpoint_dir)")
        elif logger == "tensorboard":
            # purge what an earlier attempt logged after the step this run starts from
            opened.append(TensorBoardLogger(out_dir / "tensorboard", purge_step=resumed_from + 1))
        else:
            opened.append(WandbLogger(out_dir, name=out_dir.name, config=config))
    return opened
