"""Packing for language modelling: documents -> one token stream -> fixed-length blocks.

Documents are concatenated with an eos after each. A block holds `block_size + 1` tokens: the
model reads the first `block_size` and predicts the last `block_size`. Consecutive blocks share
one token (block k is `stream[k * block_size : k * block_size + block_size + 1]`), so every
(token, next token) pair of the stream is trained on exactly once and no token is lost; the last
block is padded with `pad_id`. `RandomBlocks` instead samples blocks at random offsets, as
nanoGPT does, seeded by the step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from zoo.data.batches import ArrayBatches, Batch
from zoo.data.errors import DataError


def pack_blocks(stream: np.ndarray, block_size: int, pad_id: int) -> np.ndarray:
    """`int32[num_blocks, block_size + 1]`: the stream cut into blocks that overlap by one token."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if len(stream) < 2:
        raise DataError(f"the token stream has {len(stream)} tokens; packing needs at least 2")
    num_blocks = -(-(len(stream) - 1) // block_size)
    padded = np.full(num_blocks * block_size + 1, pad_id, dtype=np.int32)
    padded[: len(stream)] = stream
    starts = np.arange(num_blocks)[:, None] * block_size
    return padded[starts + np.arange(block_size + 1)[None, :]]


def unpack_blocks(blocks: np.ndarray, num_tokens: int) -> np.ndarray:
    """The stream `pack_blocks` cut: the first block whole, then each block without its first token."""
    if len(blocks) == 0:
        return np.zeros(0, dtype=np.int32)
    joined = np.concatenate([blocks[0], blocks[1:, 1:].reshape(-1)])
    return joined[:num_tokens]


def packed_batches(
    stream: np.ndarray,
    *,
    block_size: int,
    batch_size: int,
    pad_id: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = True,
    split_name: str = "train",
) -> ArrayBatches:
    """Batches of packed blocks, `{"tokens": int32[batch, block_size + 1]}`, reshuffled per epoch.

    Args:
        stream: the documents' token ids, joined (`pack_blocks` cuts it).
        block_size: the positions the model reads per block (each block holds one more).
        batch_size: blocks per batch.
        pad_id: the id that fills the last block past the stream's end.
        shuffle: reshuffle the blocks every epoch, from `(seed, epoch)`; False: in order.
        seed: the shuffling seed.
        drop_last: drop the last, smaller batch of an epoch (False keeps it, for evaluation).
        split_name: the data's name in messages.
    """
    blocks = pack_blocks(stream, block_size, pad_id)
    if drop_last and len(blocks) < batch_size:
        raise DataError(
            f"the {split_name!r} split packs into {len(blocks)} blocks of {block_size + 1} "
            f"tokens ({len(stream)} tokens), fewer than batch_size={batch_size}; lower "
            "batch_size or max_len, or give more text"
        )
    return ArrayBatches(
        {"tokens": blocks}, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


class RandomBlocks:
    """nanoGPT-style sampling: `batch_size` blocks at random offsets, drawn from `(seed, step)`.

    An "epoch" is as many batches as it takes to see as many tokens as the stream holds.
    """

    def __init__(self, stream: np.ndarray, *, block_size: int, batch_size: int, seed: int = 0):
        if len(stream) < block_size + 1:
            raise DataError(
                f"the token stream has {len(stream)} tokens, fewer than one block of "
                f"{block_size + 1}; lower max_len or give more text"
            )
        self.stream = np.asarray(stream, dtype=np.int32)
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.num_batches = max(1, (len(stream) - 1) // (block_size * batch_size))

    def __len__(self) -> int:
        return self.num_batches

    def batch(self, step: int) -> Batch:
        rng = np.random.default_rng((self.seed, step))
        starts = rng.integers(0, len(self.stream) - self.block_size, size=self.batch_size)
        return {"tokens": self.stream[starts[:, None] + np.arange(self.block_size + 1)[None, :]]}

    def __iter__(self) -> Iterator[Batch]:
        return (self.batch(step) for step in range(self.num_batches))
