"""Train and validation batch sources for each task, from in-memory splits or streams.

What each task encodes (`max_len` is the longest sequence the model takes):

| task | batch keys | each example |
| --- | --- | --- |
| classification | `tokens`, `labels` | bos (the pooled first token), text; at most max_len tokens |
| language_modeling, packed | `tokens` | documents + eos, cut into blocks of max_len + 1 tokens |
| language_modeling, unpacked | `tokens` | bos, text, eos; at most max_len + 1 tokens |
| translation | `src`, `tgt` | src: text, eos; tgt: bos, text, eos; each at most max_len tokens |

Training batches are shuffled and bucketed (or packed); validation batches come in order, with
the last, smaller batch kept so that every example is evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import datasets
import numpy as np

from zoo.data.batches import Batch, BatchSource
from zoo.data.bucketing import batches_of, lengths_to_fit
from zoo.data.checks import DataError, check_labels, class_count, column_values, label_values
from zoo.data.encode import Encoder, Field, encode_split
from zoo.data.options import DataConfig, resolve_buckets
from zoo.data.packing import RandomBlocks, packed_batches
from zoo.data.ragged import Ragged
from zoo.data.streaming import (
    StreamingBatches,
    encoded_examples,
    grouped_batches,
    packed_stream_batches,
)
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.pair import source_tokenizer, target_tokenizer

logger = logging.getLogger(__name__)


def task_fields(config: DataConfig, tokenizer: Tokenizer) -> tuple[Field, ...]:
    """The text columns a task reads and how each is encoded (see the module table)."""
    if config.task == "classification":
        return (
            Field(config.text_column, "tokens", tokenizer, add_bos=True, max_tokens=config.max_len),
        )
    if config.task == "language_modeling" and config.packing:
        return (Field(config.text_column, "tokens", tokenizer, add_eos=True),)
    if config.task == "language_modeling":
        limit = config.max_len + 1
        return (
            Field(
                config.text_column,
                "tokens",
                tokenizer,
                add_bos=True,
                add_eos=True,
                max_tokens=limit,
            ),
        )
    source, target = source_tokenizer(tokenizer), target_tokenizer(tokenizer)
    return (
        Field(config.source_column, "src", source, add_eos=True, max_tokens=config.max_len),
        Field(
            config.target_column,
            "tgt",
            target,
            add_bos=True,
            add_eos=True,
            max_tokens=config.max_len,
        ),
    )


def needed_columns(config: DataConfig) -> dict[str, str]:
    """Option name -> column name, for every column the task reads."""
    if config.task == "translation":
        return {"source_column": config.source_column, "target_column": config.target_column}
    needed = {"text_column": config.text_column}
    if config.task == "classification":
        needed["label_column"] = config.label_column
    return needed


def padded_lengths(config: DataConfig, encoded: dict[str, Ragged] | None) -> tuple[int, ...]:
    """Bucket lengths of the padded rows (an unpacked LM row holds one token more): fitted to
    the `encoded` examples for `buckets="auto"` (powers of two for a stream, `encoded=None`)."""
    extra = 1 if config.task == "language_modeling" else 0
    needed = None
    if encoded is not None:
        needed = np.max(np.stack([rows.lengths for rows in encoded.values()]), axis=0) - extra
        needed = lengths_to_fit(needed, group_by_length=config.group_by_length,
                                batch_size=config.batch_size, seed=config.seed)  # fmt: skip
    lengths = resolve_buckets(config.max_len, config.buckets, needed)
    return tuple(length + extra for length in lengths)


def num_classes_of(config: DataConfig, train: datasets.Dataset | datasets.IterableDataset) -> int:
    """`num_classes` as given, else from the label feature (a stream needs one of the two)."""
    if config.num_classes is not None:
        return config.num_classes
    declared = class_count(train, config.label_column)
    if declared is not None:
        return declared
    if isinstance(train, datasets.IterableDataset):
        raise DataError(
            f"num_classes is needed for a streamed dataset whose {config.label_column!r} column "
            "is not a ClassLabel (its labels cannot be scanned in advance); pass num_classes=..."
        )
    labels = label_values(column_values(train, config.label_column), config.label_column, "train")
    return classes_from_labels(labels, config.label_column, config.train_split)


def classes_from_labels(labels: np.ndarray, column: str, split_name: str) -> int:
    """`max(label) + 1`, refused when classes in between have no example (a stray label would
    add outputs that never train) and warned about when there is one class only."""
    present = labels[labels >= 0]  # negative labels are refused later, by check_labels
    counts = np.bincount(present) if present.size else np.zeros(1, np.int64)
    shown = {label: int(count) for label, count in enumerate(counts) if count}
    num_classes = len(counts)
    if len(shown) == 1:
        logger.warning(
            "the %r split has one class (label counts %s): a classifier learns nothing from it; "
            "check %r is the label column, and state the number of classes with num_classes=N "
            "(zoo train --num-classes N)",
            split_name,
            shown,
            column,
        )
        return num_classes
    empty = np.flatnonzero(counts == 0).tolist()
    if empty:
        listed = empty[:10] + (["..."] if len(empty) > 10 else [])
        raise DataError(
            f"labels in column {column!r} of the {split_name!r} split are {shown}: classes "
            f"{listed} have no example, so the model would get {num_classes} outputs; fix the "
            f"stray labels, or state the number of classes with num_classes={num_classes} "
            f"(zoo train --num-classes {num_classes}) if there really are that many"
        )
    return num_classes


def memory_sources(
    splits: dict[str, datasets.Dataset], tokenizer: Tokenizer, config: DataConfig
) -> tuple[BatchSource, BatchSource, int | None]:
    """(train, validation, num_classes) from `splits`: {train name: train, validation name: ...}."""
    if len(splits) != 2:
        raise ValueError(f"expected a train and a validation split, got {list(splits)}")
    train = next(iter(splits.values()))
    num_classes = num_classes_of(config, train) if config.task == "classification" else None
    sources = [
        memory_source(split, tokenizer, config, split_name=name, training=index == 0,
                      num_classes=num_classes)
        for index, (name, split) in enumerate(splits.items())
    ]  # fmt: skip
    return sources[0], sources[1], num_classes


def memory_source(
    split: datasets.Dataset,
    tokenizer: Tokenizer,
    config: DataConfig,
    *,
    split_name: str,
    training: bool,
    num_classes: int | None,
) -> BatchSource:
    """One split's batches: shuffled, bucketed (or packed) and full when `training`; else in
    order with the last, smaller batch kept."""
    fields = task_fields(config, tokenizer)
    extras = {}
    if num_classes is not None:
        values = column_values(split, config.label_column)
        labels = label_values(values, config.label_column, split_name)
        check_labels(labels, num_classes, config.label_column, split_name)
        extras["labels"] = labels
    encoded = encode_split(
        split, fields, split_name=split_name, truncate_long=config.truncate,
        num_proc=config.num_proc,
    )  # fmt: skip
    if config.task == "language_modeling" and config.packing:
        return _packed(encoded["tokens"].flat, tokenizer, config, training, split_name)
    return batches_of(config.group_by_length)(
        encoded,
        pad_ids={field.name: field.tokenizer.pad_id for field in fields},
        batch_size=config.batch_size,
        bucket_lengths=padded_lengths(config, encoded),
        extras=extras,
        shuffle=training,
        seed=config.seed,
        drop_last=training,
    )


def _packed(
    stream: np.ndarray, tokenizer: Tokenizer, config: DataConfig, training: bool, name: str
) -> BatchSource:
    if training and config.random_blocks:
        return RandomBlocks(
            stream, block_size=config.max_len, batch_size=config.batch_size, seed=config.seed
        )
    return packed_batches(
        stream,
        block_size=config.max_len,
        batch_size=config.batch_size,
        pad_id=tokenizer.pad_id,
        shuffle=training,
        seed=config.seed,
        drop_last=training,
        split_name=name,
    )


def stream_source(
    split: datasets.IterableDataset,
    tokenizer: Tokenizer,
    config: DataConfig,
    *,
    training: bool,
    split_name: str,
    num_classes: int | None,
) -> StreamingBatches:
    """Batches read in order from a stream (see `zoo.data.streaming`)."""
    fields = task_fields(config, tokenizer)
    passthrough = ((config.label_column, "labels"),) if num_classes is not None else ()
    encoder = Encoder(fields, passthrough)
    packed = config.task == "language_modeling" and config.packing

    def pass_batches(pass_number: int) -> Iterable[Batch]:
        examples = encoded_examples(
            split,
            encoder,
            pass_number=pass_number,
            seed=config.seed,
            shuffle_buffer=config.shuffle_buffer if training else 0,
            split_name=split_name,
            truncate_long=config.truncate,
        )
        if packed:
            return packed_stream_batches(
                examples,
                block_size=config.max_len,
                batch_size=config.batch_size,
                pad_id=tokenizer.pad_id,
                drop_last=training,
            )
        return grouped_batches(
            examples,
            names=[field.name for field in fields],
            pad_ids={field.name: field.tokenizer.pad_id for field in fields},
            batch_size=config.batch_size,
            bucket_lengths=padded_lengths(config, None),
            label_check=None if num_classes is None else (config.label_column, num_classes),
            drop_last=training,
        )

    return StreamingBatches(
        pass_batches, steps_per_epoch=config.steps_per_epoch if training else None
    )
