"""`from_hf`: a HuggingFace dataset -> train and validation batch sources and their tokenizer.

    import zoo.data
    data = zoo.data.from_hf(
        zoo.data.load_spec("json:../shared/data/rotten_tomatoes"),
        task="classification", tokenizer="word", max_len=64, batch_size=32,
    )
    train, validation, tokenizer = data
    batch = train.batch(0)  # {"tokens": int32[32, L], "labels": int32[32]}, L a bucket length

Accepts a `Dataset`, `DatasetDict`, `IterableDataset` or `IterableDatasetDict`; every option is
a field of `zoo.data.DataConfig`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Unpack

import datasets

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

from zoo.data.batches import BatchSource
from zoo.data.checks import check_columns, check_not_empty
from zoo.data.options import DataConfig, DataKeywords
from zoo.data.sources import (
    memory_source,
    memory_sources,
    needed_columns,
    num_classes_of,
    stream_source,
)
from zoo.data.splits import AnyData, hold_out, pick_splits
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.choose import choose_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskData:
    """What training needs from the data. Unpacks as `train, validation, tokenizer = data`."""

    train: BatchSource
    validation: BatchSource | None  # None only for a stream without a validation split
    tokenizer: Tokenizer
    config: DataConfig
    num_classes: int | None = None  # classification only

    def __iter__(self) -> Iterator[BatchSource | Tokenizer | None]:
        return iter((self.train, self.validation, self.tokenizer))


def from_hf(
    dataset: AnyData,
    *,
    task: str,
    tokenizer: Tokenizer | str | None = None,
    streaming: bool = False,
    **options: Unpack[DataKeywords],
) -> TaskData:
    """Batch sources for `task` (classification | language_modeling | translation).

    `tokenizer` is a `Tokenizer`, or a kind for `build_tokenizer` (char | word | tiktoken:NAME)
    learnt from the train split; None picks the task's default (word; char for language
    modelling). `streaming=True` reads an in-memory dataset as a stream (an `IterableDataset`
    is always streamed). `options` are `DataConfig` fields: `batch_size`, `max_len`, columns,
    splits, `buckets`, `packing`, `seed`, ...
    """
    config = DataConfig.from_options(task, options)
    train, validation, validation_name = pick_splits(dataset, config)
    if streaming:
        train = _as_stream(train)
        validation = None if validation is None else _as_stream(validation)
    for split, name in ((train, config.train_split), (validation, validation_name)):
        if split is not None:
            check_columns(split, needed_columns(config), name)
    if isinstance(train, datasets.IterableDataset):
        return _streamed(train, validation, tokenizer, config, validation_name)
    check_not_empty(train, config.train_split)
    if validation is None:
        train, validation = hold_out(train, config)
    check_not_empty(validation, validation_name)
    chosen = choose_tokenizer(tokenizer, train, config)
    splits = {config.train_split: train, validation_name: validation}
    train_source, validation_source, num_classes = memory_sources(splits, chosen, config)
    return TaskData(train_source, validation_source, chosen, config, num_classes)


def split_batches(
    split: datasets.Dataset | datasets.IterableDataset,
    *,
    task: str,
    tokenizer: Tokenizer,
    split_name: str = "validation",
    **options: Unpack[DataKeywords],
) -> BatchSource:
    """One split's batches in order, every example kept: what evaluating a trained model reads.

    No train split is needed: `tokenizer` is the model's own, and a classifier's `num_classes`
    comes from `options` (else the label feature, else the labels). `options` are `DataConfig`
    fields, as for `from_hf`.
    """
    config = DataConfig.from_options(task, options)
    check_columns(split, needed_columns(config), split_name)
    if not isinstance(split, datasets.IterableDataset):
        check_not_empty(split, split_name)
    num_classes = num_classes_of(config, split) if config.task == "classification" else None
    if isinstance(split, datasets.IterableDataset):
        return stream_source(split, tokenizer, config, training=False, split_name=split_name,
                             num_classes=num_classes)  # fmt: skip
    return memory_source(split, tokenizer, config, split_name=split_name, training=False,
                         num_classes=num_classes)  # fmt: skip


def _as_stream(split: datasets.Dataset | datasets.IterableDataset) -> datasets.IterableDataset:
    if isinstance(split, datasets.IterableDataset):
        return split
    return split.to_iterable_dataset()


def _streamed(
    train: datasets.IterableDataset,
    validation: datasets.Dataset | datasets.IterableDataset | None,
    tokenizer: Tokenizer | str | None,
    config: DataConfig,
    validation_name: str,
) -> TaskData:
    if validation is None:
        logger.warning("a stream without a validation split trains with no validation")
    chosen = choose_tokenizer(tokenizer, train, config)
    num_classes = num_classes_of(config, train) if config.task == "classification" else None
    train_source = stream_source(
        train,
        chosen,
        config,
        training=True,
        split_name=config.train_split,
        num_classes=num_classes,
    )
    validation_source = None
    if validation is not None:
        validation_source = stream_source(
            _as_stream(validation),
            chosen,
            config,
            training=False,
            split_name=validation_name,
            num_classes=num_classes,
        )
    return TaskData(train_source, validation_source, chosen, config, num_classes)
