"""The training record: metric rows in memory and in `metrics.jsonl`."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from zoo.files import write_text_atomic

METRICS_FILE = "metrics.jsonl"

# A logged number: a float, or for a non-finite one its name ("nan", "inf"; see `clean`).
Logged = float | str


class Row(TypedDict):
    """One line of `metrics.jsonl`: a log interval (split "train") or an evaluation ("eval")."""

    step: int  # optimizer updates done
    split: str
    loss: Logged
    metric: Logged  # the task's headline metric, named in `metric_name`
    metric_name: str
    tokens_per_s: float | None
    lr: Logged | None
    # Token positions the batches held in the row's interval (padding included). Rows written
    # before these were counted lack them.
    tokens: NotRequired[int]
    # What the loss averaged over in the row's interval (`Stats.weight`): target tokens of a
    # language model (those its loss mask keeps: chat data's --train-on), a translator and
    # masked LM, examples of a classifier, pairs of a preference objective. Called
    # `trained_tokens` before 0.2 (`read_rows` renames it).
    scored: NotRequired[int]
    # a task's further metrics by name (`Task.metrics`, e.g. "rewards/accuracies"), if any
    metrics: NotRequired[dict[str, Logged]]


class RunSummary(TypedDict, total=False):
    """The totals of a `fit` (empty until it ends)."""

    steps: int  # optimizer updates done in all
    resumed_from: int  # the step this call started from
    wall_seconds: float
    compile_seconds: float
    tokens_per_s: float | None
    final_train: Row | None  # None when this call trained no step
    final_eval: Row | None
    checkpoint: str | None  # the newest checkpoint written


@dataclass
class History:
    """Metric rows, one per log interval (split "train") or evaluation (split "eval").

    Each row has `step` (optimizer updates done), `split`, `loss`, `metric` (the task's headline
    metric, named in `metric_name`), `tokens_per_s`, `lr`, `tokens` and `scored` (what the loss averaged over).
    `summary` holds run totals.
    """

    rows: list[Row] = field(default_factory=list)
    summary: RunSummary = field(default_factory=RunSummary)

    def split(self, name: str) -> list[Row]:
        """The rows of one split ("train" or "eval"), oldest first."""
        return [row for row in self.rows if row["split"] == name]

    def last(self, name: str) -> Row | None:
        rows = self.split(name)
        return rows[-1] if rows else None

    def losses(self, name: str = "train") -> list[float]:
        return [float(row["loss"]) for row in self.split(name)]


class MetricsLog:
    """Appends rows to `directory/metrics.jsonl` (one JSON object per line), or keeps none.

    With `write=False` (processes other than 0 of a run on many) the earlier rows are read but
    nothing is written."""

    def __init__(
        self, directory: str | os.PathLike | None, *, resume_at: int | None, write: bool = True
    ):
        self.path = None if directory is None else Path(directory) / METRICS_FILE
        self.writes = write
        self.previous: list[Row] = []
        if self.path is None:
            return
        if resume_at is not None and self.path.is_file():
            # Rows after the checkpoint belong to the interrupted attempt: they are redone.
            rows = read_rows(self.path)
            self.previous = [row for row in rows if row["step"] <= resume_at]
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in self.previous))

    def write(self, row: Row) -> None:
        if self.path is None or not self.writes:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
        except OSError as error:  # e.g. a full disk
            raise OSError(
                error.errno, f"could not append to {self.path} ({error.strerror or error})"
            ) from None


def read_rows(path: Path) -> list[Row]:
    """The rows of a `metrics.jsonl`; a half-written last line (a crash mid-write) is dropped."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(_renamed(json.loads(line)))
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(
                    f"{path}: dropped the half-written last line {number} ({line[:40]!r})",
                    stacklevel=4,
                )
                break
            raise ValueError(
                f"{path} line {number} is not JSON ({error}); repair or delete that line"
            ) from None
    return rows


def clean(value: float) -> Logged:
    """A JSON-friendly float (non-finite values become strings such as "nan")."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


# row fields renamed since a run could have logged them: old name -> new name
RENAMED_FIELDS = {"trained_tokens": "scored"}


def _renamed(row: dict[str, object]) -> Row:
    """`row` with the fields of an earlier zoo under today's names."""
    for old, new in RENAMED_FIELDS.items():
        if old in row and new not in row:
            row[new] = row.pop(old)
    return cast(Row, row)
