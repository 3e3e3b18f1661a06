"""Checks on user data, each failing with a `DataError` that names the problem and the fix."""

from __future__ import annotations

from collections.abc import Iterable

import datasets
import numpy as np

from zoo.data.errors import DataError

# the `zoo train` / `zoo eval` flag of each column option, for messages read at either door
_FLAGS = {
    "text_column": "--text-column",
    "label_column": "--label-column",
    "source_column": "--source",
    "target_column": "--target",
}


def column_names(split: datasets.Dataset | datasets.IterableDataset) -> list[str]:
    """The columns of a split; a stream with unknown features is peeked at (one example)."""
    names = split.column_names
    if names is None:
        first = next(iter(split), None)
        names = [] if first is None else list(first)
    return list(names)


def check_columns(
    split: datasets.Dataset | datasets.IterableDataset, needed: dict[str, str], split_name: str
) -> None:
    """Every column in `needed` (option name -> column) exists in `split`."""
    available = column_names(split)
    for option, column in needed.items():
        if column not in available:
            raise DataError(
                f"column {column!r} is not in the {split_name!r} split; its columns are "
                f"{available}; choose one with {_FLAGS.get(option, option)} ({option}= in Python)"
            )


def column_values(split: datasets.Dataset, column: str) -> list:
    """Every value of one column, as a Python list."""
    return split.select_columns([column])[:][column]


def check_not_empty(split: datasets.Dataset, split_name: str) -> None:
    if len(split) == 0:
        raise DataError(
            f"the {split_name!r} split is empty; check the data files, or pick another split "
            "with train_split=... / validation_split=..."
        )


def check_text_values(values: Iterable[object], column: str) -> None:
    """Every value of a text column is a string (not None, not a number)."""
    text_values(values, column)


def text_values(values: Iterable[object], column: str) -> list[str]:
    """The values of a text column, each checked to be a string (`check_text_values`)."""
    texts = []
    for value in values:
        if not isinstance(value, str):
            raise DataError(
                f"column {column!r} holds a {type(value).__name__} value ({value!r}), expected "
                "text; fill or filter those examples, e.g. dataset.filter(lambda e: e[column])"
            )
        texts.append(value)
    return texts


def label_values(values: np.ndarray | list, column: str, split_name: str) -> np.ndarray:
    """`int64[examples]` labels, or an error saying why the column cannot be class ids."""
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    if array.dtype.kind == "b":
        return array.astype(np.int64)
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
        return array.astype(np.int64)
    sample = sorted({str(v) for v in array.ravel()[:1000]})[:5]
    raise DataError(
        f"labels in column {column!r} of the {split_name!r} split are not integer class ids "
        f"(values like {sample}); convert them first, e.g. "
        f"dataset = dataset.class_encode_column({column!r})"
    )


def class_count(split: datasets.Dataset | datasets.IterableDataset, column: str) -> int | None:
    """`num_classes` of a `ClassLabel` column, None for a plain one."""
    features = split.features or {}
    feature = features.get(column)
    return feature.num_classes if isinstance(feature, datasets.ClassLabel) else None


def check_labels(labels: np.ndarray, num_classes: int, column: str, split_name: str) -> None:
    """Every label lies in [0, num_classes)."""
    bad = (labels < 0) | (labels >= num_classes)
    if not np.any(bad):
        return
    values = sorted({int(v) for v in labels[bad]})
    shown = values[:10] + (["..."] if len(values) > 10 else [])
    fix = f"set num_classes={int(labels.max()) + 1}" if values[0] >= 0 else "drop them"
    raise DataError(
        f"{int(bad.sum())} labels in column {column!r} of the {split_name!r} split lie outside "
        f"[0, num_classes={num_classes}): {shown}; {fix}, or map the labels to "
        f"0..{num_classes - 1} (negative labels usually mark an unlabelled test split)"
    )
