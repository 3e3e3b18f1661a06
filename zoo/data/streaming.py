"""Streaming: batches read in order from an `IterableDataset` that need not fit in memory.

The batches form one endless sequence: pass 0 over the stream, then pass 1, ... (each pass
reshuffled through a buffer seeded by `seed` and the pass number), and `batch(step)` is the
step-th of them. Reading steps in order costs nothing extra. A step out of order (a resumed run)
restarts the stream and re-reads up to that step: resuming costs a re-read of the data already
trained on. `len(source)` is `steps_per_epoch` when given, otherwise the batches of one pass,
counted by reading the stream once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

import datasets
import numpy as np

from zoo.data.batches import Batch
from zoo.data.checks import DataError, check_labels, column_names
from zoo.data.encode import TRUNCATED, Encoder, report_truncation

logger = logging.getLogger(__name__)


class StreamingBatches:
    """A `BatchSource` over `pass_batches(pass_number)`, an iterable of the batches of one pass."""

    def __init__(
        self,
        pass_batches: Callable[[int], Iterable[Batch]],
        *,
        steps_per_epoch: int | None = None,
    ):
        self.pass_batches = pass_batches
        self.steps_per_epoch = steps_per_epoch
        self.pass_length: int | None = None  # batches in one pass, once a pass has been read
        self._iterator: Iterator[Batch] | None = None
        self._next_step = -1  # the step self._iterator yields next

    def __len__(self) -> int:
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        if self.pass_length is None:
            self.pass_length = sum(1 for _ in self.pass_batches(0))
            self._check_pass(self.pass_length)
        return self.pass_length

    def batch(self, step: int) -> Batch:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self._iterator is None or step != self._next_step:
            self._iterator = self._from_step(step)
        self._next_step = step + 1
        return next(self._iterator)

    def _from_step(self, step: int) -> Iterator[Batch]:
        """The endless batch sequence from `step` on, skipping whole passes when their length is known."""
        first_pass, skip = (0, step) if self.pass_length is None else divmod(step, self.pass_length)
        iterator = self._endless(first_pass)
        for _ in range(skip):
            next(iterator)
        return iterator

    def _endless(self, pass_number: int) -> Iterator[Batch]:
        while True:
            count = 0
            for batch in self.pass_batches(pass_number):
                count += 1
                yield batch
            self._check_pass(count)
            self.pass_length = count
            pass_number += 1

    @staticmethod
    def _check_pass(count: int) -> None:
        if count == 0:
            raise DataError(
                "the stream yields no full batch: it is empty or holds fewer examples than "
                "batch_size; lower batch_size or check the data"
            )

    def __iter__(self) -> Iterator[Batch]:
        return (self.batch(step) for step in range(len(self)))


def encoded_examples(
    split: datasets.IterableDataset,
    encoder: Encoder,
    *,
    pass_number: int,
    seed: int,
    shuffle_buffer: int,
    split_name: str,
    truncate_long: bool = True,
) -> Iterator[dict]:
    """The examples of one pass, shuffled through a buffer when `shuffle_buffer`, tokenized.

    Args:
        split: the streamed split.
        encoder: turns one row into its token id columns.
        pass_number: which pass over the stream this is; seeds its shuffle.
        seed: the run's seed, combined with `pass_number`.
        shuffle_buffer: examples held for shuffling; 0 keeps the stream's order.
        split_name: the split's name, for error messages.
        truncate_long: cut an example longer than its column allows (else an error).
    """
    stream = split
    if shuffle_buffer:
        stream = stream.shuffle(seed=seed, buffer_size=shuffle_buffer)
    stream = stream.map(encoder, batched=True, remove_columns=column_names(split))
    stream.set_epoch(pass_number)  # on the outermost dataset: `map` starts again at epoch 0
    seen = cut = 0
    for example in stream:
        seen += 1
        if example[TRUNCATED]:
            cut += 1
            if not truncate_long:
                report_truncation(1, seen, encoder.fields, split_name, truncate_long)
        yield example
    if cut:
        logger.warning("truncated %d of %d examples in the %r stream to fit", cut, seen, split_name)


def grouped_batches(
    examples: Iterator[dict],
    *,
    names: Sequence[str],
    pad_ids: dict[str, int],
    batch_size: int,
    bucket_lengths: Sequence[int],
    label_check: tuple[str, int] | None = None,
    drop_last: bool = True,
) -> Iterator[Batch]:
    """Consecutive examples in batches, padded to the shortest bucket that holds the longest.

    Args:
        examples: tokenized examples, as `encoded_examples` yields them.
        names: the columns that go into a batch.
        pad_ids: the padding id of each token column.
        batch_size: examples per batch.
        bucket_lengths: the lengths a batch may be padded to, shortest first.
        label_check: `(column, num_classes)` to check labels against, or None.
        drop_last: drop a last batch smaller than `batch_size`.
    """
    group: list[dict] = []
    for example in examples:
        group.append(example)
        if len(group) == batch_size:
            yield _pad_group(group, names, pad_ids, bucket_lengths, label_check)
            group = []
    if group and not drop_last:
        yield _pad_group(group, names, pad_ids, bucket_lengths, label_check)


def _pad_group(
    group: list[dict],
    names: Sequence[str],
    pad_ids: dict[str, int],
    bucket_lengths: Sequence[int],
    label_check: tuple[str, int] | None,
) -> Batch:
    longest = max(len(example[name]) for example in group for name in names)
    length = next(b for b in bucket_lengths if b >= longest)
    batch: Batch = {}
    for name in names:
        rows = np.full((len(group), length), pad_ids[name], dtype=np.int32)
        for row, example in enumerate(group):
            rows[row, : len(example[name])] = example[name]
        batch[name] = rows
    if label_check is not None:
        column, num_classes = label_check
        labels = np.array([example["labels"] for example in group], dtype=np.int64)
        check_labels(labels, num_classes, column, "streamed")
        batch["labels"] = labels.astype(np.int32)
    return batch


def packed_stream_batches(
    examples: Iterator[dict],
    *,
    block_size: int,
    batch_size: int,
    pad_id: int,
    drop_last: bool = True,
) -> Iterator[Batch]:
    """Blocks of `block_size + 1` tokens (overlapping by one, as `pack_blocks`), in batches."""
    buffer: list[int] = []
    blocks: list[list[int]] = []
    for example in examples:
        buffer.extend(example["tokens"])
        while len(buffer) >= block_size + 1:
            blocks.append(buffer[: block_size + 1])
            del buffer[:block_size]
            if len(blocks) == batch_size:
                yield {"tokens": np.array(blocks, dtype=np.int32)}
                blocks = []
    if drop_last:
        return
    if len(buffer) > 1:
        blocks.append(buffer + [pad_id] * (block_size + 1 - len(buffer)))
    if blocks:
        yield {"tokens": np.array(blocks, dtype=np.int32)}
