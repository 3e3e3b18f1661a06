"""The records a `zoo.Trainer` and its `fit` take: how the loop runs, and what a run writes.

- `LoopSettings` (`Trainer(loop=...)`): how often the loop logs, evaluates and checkpoints, how
  many checkpoints it keeps, and where its metrics go beside `metrics.jsonl`. None of it changes
  the compiled step, so trainers that differ only here share one.
- `Outputs` (`Trainer.fit(outputs=...)`): the folders a run writes into, and what it saves
  beside the final model.

Each checks its fields once, when it is made, with an error that names the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import equinox as eqx

from zoo.data.tokenizers.base import Tokenizer
from zoo.train.loggers import LoggerSpec, check_loggers

__all__ = ["LoopSettings", "Outputs", "StepCallback"]


@runtime_checkable
class StepCallback(Protocol):
    """Called as `callback(step, model)` after every `every`-th optimizer update."""

    every: int

    def __call__(self, step: int, model: eqx.Module) -> None: ...


@dataclass(frozen=True)
class LoopSettings:
    """How the training loop runs around its compiled step.

    ```python
    zoo.Trainer(task, optimizer, loop=zoo.train.LoopSettings(eval_every=200, checkpoint_every=500))
    ```

    - `log_every`: steps per train row in the history and `metrics.jsonl`; also how often the
      loss is checked for NaN/inf (a host sync).
    - `eval_every`: steps between evaluations (None: only at the end).
    - `eval_limit`: at most this many eval batches per evaluation (None: all of them).
    - `checkpoint_every`: steps between checkpoints (None: only at the end and on Ctrl-C or
      SIGTERM).
    - `keep`: how many checkpoints to keep.
    - `progress`: show a tqdm bar on a terminal, a line every half minute in a log
      (`zoo.progress.Progress`); only in process 0 of many.
    - `loggers`: also send the metrics rows to "tensorboard" and/or "wandb" (in the run's
      `out_dir`; the `tensorboard` / `wandb` extras), or to objects with `log(row)` and
      `close()`; see `zoo.train.loggers`. Kept as a tuple; a missing package is named now.
    - `callbacks`: objects with `every` (steps) and `__call__(step, model)`, called with the
      model every `every` steps (e.g. `zoo.cli._samples.SampleReplies`: greedy replies to
      held-out prompts). Kept as a tuple.
    """

    log_every: int = 10
    eval_every: int | None = None
    eval_limit: int | None = None
    checkpoint_every: int | None = None
    keep: int = 3
    progress: bool = True
    loggers: LoggerSpec | Iterable[LoggerSpec] = ()
    callbacks: Iterable[StepCallback] = ()  # called with the model every `callback.every` steps

    def __post_init__(self) -> None:
        for name in ("log_every", "keep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("eval_every", "eval_limit", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        object.__setattr__(self, "loggers", check_loggers(self.loggers))
        callbacks = tuple(self.callbacks)
        for callback in callbacks:
            every = getattr(callback, "every", None)
            if not callable(callback) or not isinstance(every, int) or every < 1:
                raise ValueError(
                    f"a callback needs a positive integer `every` and __call__(step, model), "
                    f"got {callback!r}"
                )
        object.__setattr__(self, "callbacks", callbacks)


@dataclass(frozen=True)
class Outputs:
    """Where one `Trainer.fit` writes, and what it saves beside the final model.

    ```python
    trainer.fit(model, batches, steps=2000, key=key,
                outputs=zoo.train.Outputs("runs/gpt", tokenizer=tokenizer, plot=True))
    ```

    - `checkpoint_dir`: the checkpoints (every `checkpoint_every` steps, at the end, and on
      Ctrl-C or SIGTERM); None writes none, and then nothing can be resumed.
    - `out_dir` (default: `checkpoint_dir`): `metrics.jsonl`, the final model saved with
      `zoo.save`, the loggers' files and `curves.png`.
    - `tokenizer`: saved with the final model.
    - `chat_template`: the chat template's Jinja text (or a `ChatTemplate`) the model was
      trained with, e.g. `chat_data(...).template`; written as `chat_template.jinja` beside
      the final model (after the tokenizer's own), where `zoo chat`, `zoo eval` and
      `zoo export` read it.
    - `plot`: also write `out_dir/curves.png` (the `plot` extra: matplotlib).
    """

    checkpoint_dir: str | os.PathLike | None = None
    out_dir: str | os.PathLike | None = None
    tokenizer: Tokenizer | None = None
    plot: bool = False
    # Jinja text or a ChatTemplate, kept as its text (any other value is refused by name)
    chat_template: object = None

    def __post_init__(self) -> None:
        if self.plot and self.folder is None:
            raise ValueError("plot=True needs out_dir (or checkpoint_dir) to write curves.png")
        if self.chat_template is not None:
            text = getattr(self.chat_template, "source", self.chat_template)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(
                    "chat_template must be Jinja text or a ChatTemplate (e.g. "
                    f"chat_data(...).template), got {type(self.chat_template).__name__}"
                )
            object.__setattr__(self, "chat_template", text)

    @property
    def chat_template_text(self) -> str | None:
        """The chat template's Jinja text, written as DIR/chat_template.jinja (None: none)."""
        return self.chat_template if isinstance(self.chat_template, str) else None

    @property
    def checkpoints(self) -> Path | None:
        """The checkpoint folder as a path (None: no checkpoints)."""
        return None if self.checkpoint_dir is None else Path(self.checkpoint_dir)

    @property
    def folder(self) -> Path | None:
        """The folder of the metrics and the final model: `out_dir`, else `checkpoint_dir`."""
        chosen = self.checkpoint_dir if self.out_dir is None else self.out_dir
        return None if chosen is None else Path(chosen)
