"""Which examples train and which validate: the dataset's own splits, or a seeded holdout.

A `DatasetDict` gives `train_split` and, for validation, `validation_split` or the first of
validation / valid / dev / val it has. Without one, validation is held out of the train split:
a seeded random `holdout` fraction of the examples, or, for packed language modelling, the last
`holdout` fraction of the text by position (nanoGPT's 90/10 cut of tiny_shakespeare). A stream
has no cheap holdout: without a validation split it trains with no validation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TypeAlias

import datasets

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

from zoo.data.checks import DataError, check_not_empty, column_values
from zoo.data.options import DataConfig

logger = logging.getLogger(__name__)
VALIDATION_NAMES = ("validation", "valid", "dev", "val")
AnySplit: TypeAlias = datasets.Dataset | datasets.IterableDataset
# A split, a DatasetDict / IterableDatasetDict, or any mapping of split names to splits.
AnyData: TypeAlias = (
    AnySplit | datasets.DatasetDict | datasets.IterableDatasetDict | Mapping[str, AnySplit]
)


def pick_splits(data: AnyData, config: DataConfig) -> tuple[AnySplit, AnySplit | None, str]:
    """(train, validation or None, the validation split's name) before any holdout."""
    holdout_name = f"{config.train_split} holdout"
    if isinstance(data, datasets.Dataset | datasets.IterableDataset):
        return data, None, holdout_name
    available = list(data)
    if config.train_split not in data:
        raise DataError(
            f"no {config.train_split!r} split in the dataset; its splits are {available}; "
            "choose one with train_split=..."
        )
    train = data[config.train_split]
    if config.validation_split is not None:
        if config.validation_split not in data:
            raise DataError(
                f"no {config.validation_split!r} split in the dataset; its splits are "
                f"{available}; choose one with validation_split=... (or leave it unset to hold "
                "out part of the train split)"
            )
        return train, data[config.validation_split], config.validation_split
    for name in VALIDATION_NAMES:
        if name in data and name != config.train_split:
            return train, data[name], name
    return train, None, holdout_name


def hold_out(train: datasets.Dataset, config: DataConfig) -> tuple[datasets.Dataset, ...]:
    """(train, validation) from the train split alone, as the module docstring describes."""
    check_not_empty(train, config.train_split)
    if config.task == "language_modeling" and config.packing:
        return split_by_position(train, config.text_column, config.holdout)
    if len(train) < 2:
        raise DataError(
            f"the {config.train_split!r} split has {len(train)} example: too few to hold out a "
            "validation part; add examples or give a validation split"
        )
    parts = train.train_test_split(test_size=config.holdout, seed=config.seed)
    logger.info(
        "no validation split: held out %d of %d examples (seed %d)",
        len(parts["test"]),
        len(train),
        config.seed,
    )
    return parts["train"], parts["test"]


def split_by_position(
    split: datasets.Dataset, column: str, fraction: float
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The first `1 - fraction` of the characters of `column` (documents in order) and the rest.

    The document that straddles the cut is cut in two, so both sides keep every character.
    """
    texts = column_values(split, column)
    total = sum(len(text) for text in texts)
    cut = int(total * (1.0 - fraction))
    if cut == 0 or cut == total:
        raise DataError(
            f"the text has {total} characters: too few to hold out {fraction:.0%} for "
            "validation; give more text or a validation split"
        )
    head: list[str] = []
    tail: list[str] = []
    seen = 0
    for index, text in enumerate(texts):
        if seen + len(text) >= cut:
            head.append(text[: cut - seen])
            tail = [text[cut - seen :], *texts[index + 1 :]]
            break
        head.append(text)
        seen += len(text)
    logger.info("no validation split: the last %d of %d characters validate", total - cut, total)
    train_texts = [text for text in head if text]
    validation_texts = [text for text in tail if text]
    return (
        datasets.Dataset.from_dict({column: train_texts}),
        datasets.Dataset.from_dict({column: validation_texts}),
    )
