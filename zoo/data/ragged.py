"""Variable-length token sequences stored flat: one int32 array plus row offsets.

Padding every example to the longest wastes memory on a corpus of short sentences; a `Ragged`
keeps only the tokens and pads just the rows of the batch being built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


class Ragged:
    """Rows of token ids: row `i` is `flat[offsets[i]:offsets[i + 1]]`."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(flat):
            raise ValueError("offsets must start at 0 and end at len(flat)")
        self.flat = np.asarray(flat, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int] | np.ndarray]) -> Ragged:
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.fromiter((i for row in rows for i in row), dtype=np.int32, count=int(offsets[-1]))
        return cls(flat, offsets)

    @classmethod
    def from_arrow(cls, column: pa.ChunkedArray | pa.Array) -> Ragged:
        """A list-of-integers Arrow column (what `Dataset.map` writes) without Python loops."""
        if isinstance(column, pa.ChunkedArray):
            column = (
                column.combine_chunks() if column.num_chunks else pa.array([], pa.list_(pa.int32()))
            )
        offsets = np.asarray(column.offsets, dtype=np.int64)
        flat = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.int32)
        return cls(flat, offsets - offsets[0])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """`int64[rows]`: tokens in each row."""
        return np.diff(self.offsets)

    def row(self, index: int) -> np.ndarray:
        return self.flat[self.offsets[index] : self.offsets[index + 1]]

    def take(self, rows: np.ndarray) -> Ragged:
        """The rows `rows`, in that order."""
        return Ragged.from_rows([self.row(int(i)) for i in rows])

    def padded(self, rows: np.ndarray, length: int, pad_id: int) -> np.ndarray:
        """`int32[len(rows), length]`: the rows, each padded with `pad_id` (never cut)."""
        out = np.full((len(rows), length), pad_id, dtype=np.int32)
        for slot, index in enumerate(rows):
            tokens = self.row(int(index))
            if len(tokens) > length:
                raise ValueError(f"row {index} has {len(tokens)} tokens, more than {length}")
            out[slot, : len(tokens)] = tokens
        return out
