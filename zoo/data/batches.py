"""Batch sources: what the trainer consumes.

A batch is a dict of `int32` numpy arrays with the batch axis first:

| task | keys |
| --- | --- |
| classification | `tokens [batch, seq]`, `labels [batch]` (optional `token_types [batch, seq]`) |
| language modelling | `tokens [batch, seq]` (the model reads `tokens[:, :-1]`, predicts `tokens[:, 1:]`); optional `loss_mask [batch, seq]` (nonzero where a token is scored) |
| translation | `src [batch, src]`, `tgt [batch, tgt]` (`tgt` = bos, tokens, eos, padding) |

Padding uses the model's `pad_id`. A batch source is indexed by the training step, so a run
that resumes at step k sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

Batch = dict[str, np.ndarray]


@runtime_checkable
class BatchSource(Protocol):
    """Deterministic batches by step: `batch(step)` is a pure function of `step`."""

    def __len__(self) -> int:
        """Batches in one epoch."""
        ...

    def batch(self, step: int) -> Batch: ...


@runtime_checkable
class OnPolicySource(Protocol):
    """Batches drawn with the model being trained (RL from rewards: completions it samples).

    The trainer calls `batch_for(step, model, key)` with its current model and the run's key
    (which checkpoints keep) in place of `batch(step)`."""

    def __len__(self) -> int:
        """Batches in one epoch (of prompts)."""
        ...

    def batch(self, step: int) -> Batch: ...

    def batch_for(self, step: int, model: object, key: object) -> Batch: ...


def draw_batch(source: BatchSource, step: int, model: object, key: object) -> Batch:
    """The batch of `step`: from the model being trained where the source samples with it."""
    if isinstance(source, OnPolicySource):
        return source.batch_for(step, model, key)
    return source.batch(step)


def check_examples(sizes: dict[str, int], batch_size: int, drop_last: bool) -> int:
    """The common number of examples of named columns, checked against the batch size."""
    num = next(iter(sizes.values()), 0)
    if any(size != num for size in sizes.values()):
        raise ValueError(f"columns disagree on the number of examples: {sizes}")
    if num == 0:
        raise ValueError("no examples: the dataset (or this split) is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if drop_last and num < batch_size:
        raise ValueError(f"only {num} examples for batch_size={batch_size}; lower the batch size")
    return num


class ArrayBatches:
    """Fixed-size batches from in-memory arrays, reshuffled every epoch with a seed.

    Every array in `arrays` shares the first axis (examples). With `drop_last` (the default)
    each epoch yields `num_examples // batch_size` full batches, so every batch has one shape.
    """

    def __init__(
        self,
        arrays: Batch,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ):
        sizes = {name: len(a) for name, a in arrays.items()}
        if not sizes:
            raise ValueError("ArrayBatches needs at least one array")
        num = check_examples(sizes, batch_size, drop_last)
        self.arrays = {name: np.asarray(a) for name, a in arrays.items()}
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_examples = num
        self.num_batches = num // batch_size if drop_last else -(-num // batch_size)

    def __len__(self) -> int:
        return self.num_batches

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_examples)

    def batch(self, step: int) -> Batch:
        epoch, index = divmod(step, self.num_batches)
        rows = self._order(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        return {name: a[rows] for name, a in self.arrays.items()}

    def __iter__(self):
        """One epoch, in order of steps 0..len-1."""
        return (self.batch(step) for step in range(self.num_batches))
