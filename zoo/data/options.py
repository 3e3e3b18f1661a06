"""`DataConfig`: every option of `from_hf`, with its default and what it means.

Column defaults per task: classification reads `text` and `label`; language modelling reads
`text`; translation reads source `de` and target `en` (Multi30k German -> English, the classic
tutorial pair: pass `source_column="en", target_column="de"` for the other direction).

Conversations for instruction tuning have their own record beside this one, `ChatDataConfig`
(`zoo.data.chat.options`), the options of `chat_data` and `chat_evaluation`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict, cast

import numpy as np

from zoo.data.tokenizers.word import WordOptions

TASKS = ("classification", "language_modeling", "translation")
TASK_ALIASES = {
    "classification": "classification",
    "classifier": "classification",
    "language_modeling": "language_modeling",
    "lm": "language_modeling",
    "gpt": "language_modeling",
    "translation": "translation",
    "translator": "translation",
}
SMALLEST_BUCKET = 16
# `buckets="auto"`: at most this many padded lengths, fitted to the data's lengths, each a
# multiple of BUCKET_MULTIPLE (or max_len)
AUTO_BUCKET_COUNT = 4
BUCKET_MULTIPLE = 8
AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """How a dataset becomes batches. Build it through `from_hf(dataset, task=..., **options)`."""

    task: str  # classification | language_modeling (lm) | translation
    batch_size: int = 32  # examples (LM: blocks) per batch
    max_len: int = 128  # longest sequence the model takes (its max_positions)
    text_column: str = "text"  # classification and language modelling input
    label_column: str = "label"  # classification target, integers in [0, num_classes)
    source_column: str = "de"  # translation input
    target_column: str = "en"  # translation output
    num_classes: int | None = None  # None: the ClassLabel feature's, else max(train label) + 1
    train_split: str = "train"  # split to train on
    validation_split: str | None = None  # None: validation/valid/dev when present, else holdout
    holdout: float = 0.1  # fraction held out for validation when the data has no such split
    buckets: Sequence[int] | str | None = AUTO  # padded lengths (auto: fitted; None: 16, 32, ...)
    packing: bool = True  # LM: concatenate documents into blocks of max_len + 1 tokens
    group_by_length: bool = False  # unpacked: batches of one bucket (True) or drawn at random
    random_blocks: bool = False  # LM: nanoGPT-style random offsets instead of shuffled blocks
    truncate: bool = True  # cut over-long examples (and log how many); False raises instead
    seed: int = 0  # shuffling and holdout seed
    share_tokenizer: bool = False  # translation: one vocabulary for both languages
    tokenizer_options: WordOptions | None = None  # for build_tokenizer, e.g. {"min_freq": 2}
    tokenizer_sample: int = 100_000  # streaming: examples read to learn a char/word vocabulary
    shuffle_buffer: int = 10_000  # streaming: examples in the shuffle buffer (0: no shuffling)
    steps_per_epoch: int | None = None  # streaming: batches per epoch (None: count by one pass)
    num_proc: int | None = None  # processes for Dataset.map

    def __post_init__(self) -> None:
        if self.task not in TASK_ALIASES:
            raise ValueError(f"unknown task {self.task!r}; choose one of {list(TASKS)}")
        object.__setattr__(self, "task", TASK_ALIASES[self.task])
        for name in ("batch_size", "max_len", "tokenizer_sample"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        minimum = 3 if self.task == "translation" else 2
        if self.max_len < minimum:
            raise ValueError(f"max_len={self.max_len} leaves no room for text; use >= {minimum}")
        if self.validation_split is not None and self.validation_split == self.train_split:
            raise ValueError(
                f"validation_split and train_split are both {self.train_split!r}; validating on "
                "the training examples measures nothing: pick another split or leave it unset"
            )
        if self.task == "translation" and self.source_column == self.target_column:
            raise ValueError(
                f"source_column and target_column are both {self.source_column!r}: the model "
                "would learn to copy its input; name two columns (--source DE --target EN)"
            )
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"holdout must be a fraction in (0, 1), got {self.holdout}")
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {self.num_classes}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be positive, got {self.steps_per_epoch}")
        object.__setattr__(self, "buckets", check_buckets(self.max_len, self.buckets))

    @classmethod
    def from_options(cls, task: str, options: Mapping[str, Any]) -> DataConfig:
        """`DataConfig(task=task, **options)` with an error that lists the valid options.

        `options` may come from an untyped source (the command line): their names are checked
        here and their values by the constructor; typed callers pass a `DataKeywords`."""
        valid = sorted(f.name for f in fields(cls) if f.name != "task")
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(f"unknown data options {unknown}; valid options: {valid}")
        return cls(task=task, **options)


class DataKeywords(TypedDict, total=False):
    """`DataConfig`'s fields but `task`, as keywords: the `options` of `from_hf(..., **options)`
    (each is described on `DataConfig`)."""

    batch_size: int
    max_len: int
    text_column: str
    label_column: str
    source_column: str
    target_column: str
    num_classes: int | None
    train_split: str
    validation_split: str | None
    holdout: float
    buckets: Sequence[int] | str | None
    packing: bool
    group_by_length: bool
    random_blocks: bool
    truncate: bool
    seed: int
    share_tokenizer: bool
    tokenizer_options: WordOptions | None
    tokenizer_sample: int
    shuffle_buffer: int
    steps_per_epoch: int | None
    num_proc: int | None


def check_buckets(max_len: int, buckets: Sequence[int] | str | None) -> tuple[int, ...] | str:
    """`buckets` as a config keeps it: "auto" as it is (fitted once the lengths are known, by
    `resolve_buckets`), else the sorted lengths of `bucket_lengths` (which refuses bad ones)."""
    if isinstance(buckets, str):
        if buckets != AUTO:
            raise ValueError(
                f"buckets={buckets!r}: give 'auto' (lengths fitted to the data), None (powers "
                "of two from 16) or a list of padded lengths such as [32, 64, 96]"
            )
        return buckets
    return bucket_lengths(max_len, buckets)


def resolve_buckets(
    max_len: int, buckets: Sequence[int] | str | None, needed: np.ndarray | None
) -> tuple[int, ...]:
    """The padded lengths to use: `fit_buckets` on the examples' `needed` lengths for "auto"
    (powers of two where the lengths are not known in advance, `needed=None`: a stream), else
    `bucket_lengths`."""
    if buckets == AUTO:
        if needed is None:
            return bucket_lengths(max_len, None)
        return fit_buckets(needed, max_len=max_len)
    return bucket_lengths(max_len, cast("Sequence[int] | None", buckets))


def fit_buckets(
    needed: Sequence[int] | np.ndarray,
    *,
    max_len: int,
    count: int = AUTO_BUCKET_COUNT,
    multiple: int = BUCKET_MULTIPLE,
) -> tuple[int, ...]:
    """At most `count` padded lengths (multiples of `multiple`, none over `max_len`) that pad
    examples of `needed` lengths the least in all, then `max_len`, so any longer example still
    fits somewhere (an empty bucket costs nothing: no batch has its shape).

    Each example pads to the shortest chosen length that holds it. An exact dynamic program over
    the distinct rounded lengths: `best[k][j]` is the fewest padded positions of the examples up
    to candidate `j` with `k + 1` lengths, the last of them candidate `j`.
    """
    # at most 512 candidates, so the program stays small for long contexts
    step = multiple * max(1, max_len // (512 * multiple))
    rounded = np.minimum(-(-np.maximum(np.asarray(needed, np.int64), 1) // step) * step, max_len)
    if rounded.size == 0:
        return (max_len,)
    candidates, counts = np.unique(rounded, return_counts=True)
    upto = np.cumsum(counts)  # examples at candidates 0..j
    size = len(candidates)
    best = candidates * upto  # one length: everything pads to candidates[j]
    pointers = []
    for _ in range(1, min(count, size)):
        # the last length at j, the one before it at i < j
        cost = best[:, None] + candidates[None, :] * (upto[None, :] - upto[:, None])
        cost[np.tril_indices(size)] = np.iinfo(np.int64).max
        previous = np.argmin(cost, axis=0)
        lowest = cost[previous, np.arange(size)]
        pointers.append(np.where(lowest < best, previous, -1))
        best = np.minimum(lowest, best)
    j = size - 1
    lengths = [int(candidates[j])]
    for back in reversed(pointers):
        if back[j] >= 0:
            j = int(back[j])
            lengths.append(int(candidates[j]))
    return tuple(sorted({*lengths, max_len}))


def bucket_lengths(max_len: int, buckets: Sequence[int] | None) -> tuple[int, ...]:
    """Sorted padded lengths, the last one `max_len`: powers of two from 16 for None."""
    if buckets is None:
        lengths = []
        length = SMALLEST_BUCKET
        while length < max_len:
            lengths.append(length)
            length *= 2
        return (*lengths, max_len)
    lengths = sorted({int(length) for length in buckets})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"buckets must be positive lengths, got {list(buckets)}")
    if lengths[-1] > max_len:
        raise ValueError(
            f"bucket length {lengths[-1]} exceeds max_len={max_len}; the model takes at most "
            "max_len positions: drop that bucket or raise max_len"
        )
    if lengths[-1] < max_len:
        lengths.append(max_len)  # every example must fit somewhere
    return tuple(lengths)
