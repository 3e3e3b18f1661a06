"""The reference model of DPO-style losses, as `reference_logps` in the batches.

`with_reference(batches, reference)` adds to every batch the reference model's log-probability
of each answer, computed when the batch is drawn (one jitted forward pass, no gradient): the
reference may be a copy of the starting weights (what `zoo train` uses by default) or any model
with the same tokenizer. `precompute=True` runs the reference over the whole dataset once and
stores the numbers beside the data, so that training holds one model; both give the same
numbers, batch for batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import equinox as eqx
import jax
import numpy as np
from jaxtyping import ArrayLike

from zoo.data.batches import ArrayBatches, Batch, BatchSource
from zoo.tasks.base import LanguageModel
from zoo.tasks.preference import REFERENCE_KEY, answer_logps


@eqx.filter_jit
def _reference_logps(model: LanguageModel, batch: Mapping[str, ArrayLike]) -> jax.Array:
    logps, _ = answer_logps(model, batch)
    return logps


def reference_logps(model: LanguageModel, batch: Mapping[str, ArrayLike]) -> np.ndarray:
    """`float32[batch, 2]`: `model`'s log-probability of each answer of `batch` (no dropout)."""
    arrays = {name: np.asarray(batch[name]) for name in ("tokens", "loss_mask", "lengths")}
    return np.asarray(_reference_logps(model, arrays), np.float32)


class ReferenceBatches:
    """`batches` with the reference model's `reference_logps` added to each batch."""

    def __init__(self, batches: BatchSource, reference: LanguageModel):
        self.batches = batches
        self.reference = reference

    def __len__(self) -> int:
        return len(self.batches)

    def batch(self, step: int) -> Batch:
        batch = dict(self.batches.batch(step))
        batch[REFERENCE_KEY] = reference_logps(self.reference, batch)
        return batch

    def __iter__(self):
        return (self.batch(step) for step in range(len(self)))


def reference_numbers(
    batches: ArrayBatches, reference: LanguageModel, *, progress: Callable[[], object] | None = None
) -> np.ndarray:
    """`float32[examples, 2]`: the reference's `reference_logps` of every pair of `batches`, in
    the arrays' order, a batch of rows at a time (`progress()` is called after each batch).

    Each batch is dispatched before the previous one is read back, so the device never waits
    for the host between batches (as an evaluation's pass).
    """
    arrays = batches.arrays
    count, size = batches.num_examples, batches.batch_size
    parts: list[jax.Array] = []
    for start in range(0, count, size):
        rows = np.arange(start, min(start + size, count))
        if len(rows) < size:  # the last rows: padded with the first, so one shape compiles
            rows = np.concatenate([rows, np.zeros(size - len(rows), rows.dtype)])
        chunk = {name: arrays[name][rows] for name in ("tokens", "loss_mask", "lengths")}
        parts.append(_reference_logps(reference, chunk))
        if len(parts) > 1:
            parts[-2].block_until_ready()
            if progress is not None:
                progress()
    if parts:
        parts[-1].block_until_ready()
        if progress is not None:
            progress()
    numbers = np.concatenate([np.asarray(part, np.float32) for part in parts])
    return numbers[:count]


def with_reference_numbers(batches: ArrayBatches, numbers: np.ndarray) -> ArrayBatches:
    """A copy of `batches` whose arrays hold `numbers` (`[examples, 2]`, from
    `reference_numbers`) as each pair's `reference_logps`."""
    if numbers.shape != (batches.num_examples, 2):
        raise ValueError(
            f"reference numbers must be [examples, 2] = ({batches.num_examples}, 2), got "
            f"{numbers.shape}"
        )
    copy = ArrayBatches.__new__(ArrayBatches)
    copy.__dict__.update(vars(batches))
    copy.arrays = {**batches.arrays, REFERENCE_KEY: np.asarray(numbers, np.float32)}
    return copy


def precompute_reference(
    batches: ArrayBatches, reference: LanguageModel, *, progress: Callable[[], object] | None = None
) -> ArrayBatches:
    """A copy of `batches` whose arrays hold the reference's `reference_logps` of every pair,
    computed once, a batch of rows at a time in the data's order (`progress()` after each)."""
    numbers = reference_numbers(batches, reference, progress=progress)
    return with_reference_numbers(batches, numbers)


def with_reference(
    batches: BatchSource, reference: LanguageModel, *, precompute: bool = False
) -> BatchSource:
    """`batches` whose batches carry the `reference_logps` of `reference` (see the module doc).

    `precompute` needs in-memory batches (`zoo.data.ArrayBatches`, as `preference_data` makes).
    """
    if not precompute:
        return ReferenceBatches(batches, reference)
    if not isinstance(batches, ArrayBatches):
        raise TypeError(
            f"precompute=True stores the numbers beside in-memory arrays (zoo.data.ArrayBatches), "
            f"got {type(batches).__name__}; use precompute=False"
        )
    return precompute_reference(batches, reference)
