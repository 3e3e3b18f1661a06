"""The target positions a language-model batch scores: `loss_positions`, so the output head
runs on those positions only.

A chat fine-tune scores few of the positions it reads (the replies, often a word or two), yet
the output head, `[positions, d_model] x [d_model, vocab]`, is the widest matmul of a small
model: SmolLM2-135M's 49,152-word head is a fifth of its step. A batch that carries
`loss_positions` (`int32 [batch, capacity]`: each row's scored target positions in order, then
-1) lets `zoo.tasks.LanguageModeling` gather those positions' features before the head: the same
loss and gradients, from a head `capacity` positions wide instead of the row's length.

A capacity is fixed per padded length (`capacity_for`), so a bucket's batches keep one shape and
compile once. Target position `t` predicts token `t + 1`; it is scored where `loss_mask[t + 1]`
is set and, in a packed row, `t + 1` continues the conversation of `t` (the task's own rule;
the task also checks that every position it scores is listed).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from zoo.data.batches import Batch, BatchSource

LOSS_POSITIONS = "loss_positions"
POSITION_MULTIPLE = 8  # capacities are rounded up to this, so nearby counts share a shape


def scored_targets(loss_mask: np.ndarray, segments: np.ndarray | None = None) -> np.ndarray:
    """`bool [rows, width - 1]`: the target positions the loss scores (see the module doc)."""
    scored = np.asarray(loss_mask)[:, 1:] != 0
    if segments is not None:
        segments = np.asarray(segments)
        scored &= segments[:, 1:] == segments[:, :-1]
    return scored


def largest_count(loss_mask: np.ndarray, segments: np.ndarray | None = None) -> int:
    """The most scored targets of any row."""
    return int(scored_targets(loss_mask, segments).sum(axis=1).max(initial=0))


def capacity_for(most: int, targets: int) -> int | None:
    """The positions listed for rows of `targets` target positions whose most scored targets
    is `most`: that count rounded up to `POSITION_MULTIPLE`; None where that saves less than
    half of the head's positions (the head then runs on every position)."""
    capacity = max(POSITION_MULTIPLE, -(-most // POSITION_MULTIPLE) * POSITION_MULTIPLE)
    return capacity if 2 * capacity <= targets else None


def loss_positions(
    loss_mask: np.ndarray, capacity: int, segments: np.ndarray | None = None
) -> np.ndarray:
    """`int32 [rows, capacity]`: each row's scored target positions, ascending, then -1."""
    scored = scored_targets(loss_mask, segments)
    counts = scored.sum(axis=1)
    if counts.max(initial=0) > capacity:
        raise ValueError(
            f"a row scores {int(counts.max())} targets, more than the capacity {capacity} of "
            "its loss positions; compute the capacity from the rows (largest_count)"
        )
    order = np.argsort(~scored, axis=1, kind="stable")[:, :capacity]
    if order.shape[1] < capacity:  # fewer targets than the capacity: pad the columns
        order = np.pad(order, ((0, 0), (0, capacity - order.shape[1])))
    listed = np.arange(capacity)[None, :] < counts[:, None]
    return np.where(listed, order, -1).astype(np.int32)


class ListedPositions:
    """The batches of `source` (padded language-modelling rows: `tokens`, `loss_mask`) with
    `loss_positions` added, its capacity fixed per padded length from `most`, the most scored
    targets of any row. Everything else (`len`, `lengths`, ...) is the source's."""

    def __init__(self, source: BatchSource, most: int):
        self.source = source
        self.most = most

    def batch(self, step: int) -> Batch:
        batch = self.source.batch(step)
        mask = batch["loss_mask"]
        capacity = capacity_for(self.most, mask.shape[1] - 1)
        if capacity is None:
            return batch
        return {**batch, LOSS_POSITIONS: loss_positions(mask, capacity, batch.get("segments"))}

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Batch]:
        return (self.batch(step) for step in range(len(self)))

    def __getattr__(self, name: str) -> object:
        if name in ("source", "most"):  # not set yet (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.source, name)
