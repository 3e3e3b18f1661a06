"""A batch of per-example decode caches, stored the way the model's layer scan reads them.

A model's `DecodeCache` is per example: `[layers, max_len, heads, head_dim]`. Batching it on a
leading axis would make every decoding step transpose the whole cache in and out of the layer
scan (vmap moves the batch axis behind the scanned `layers` axis), which costs more than the
attention itself. So the batch sits on axis 1 (`[layers, rows, ...]`) and `vmap` runs with
`in_axes`/`out_axes` = `ROW_AXES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
from jaxtyping import Array, Float, Int

from zoo.models.common import DecodeCache


class CacheRows(NamedTuple):
    """Decode caches of `rows` sequences, layers first."""

    keys: Float[Array, "layers rows max_len heads head_dim"]
    values: Float[Array, "layers rows max_len heads head_dim"]
    index: Int[Array, " rows"]  # positions already filled, per sequence


# where each field keeps its rows (vmap's in_axes / out_axes)
ROW_AXES = CacheRows(keys=1, values=1, index=0)  # type: ignore[arg-type]


def to_rows(cache: DecodeCache) -> CacheRows:
    """One example's cache as a (per-example) `CacheRows` entry."""
    return CacheRows(cache.keys, cache.values, cache.index)


def to_cache(row: CacheRows) -> DecodeCache:
    """One example's `CacheRows` entry (inside vmap) as the model's `DecodeCache`."""
    return DecodeCache(row.keys, row.values, row.index)


def step_rows(
    one: Callable[[Int[Array, ""], DecodeCache], tuple[Float[Array, " vocab"], DecodeCache]],
) -> Callable[[Int[Array, " rows"], CacheRows], tuple[Float[Array, "rows vocab"], CacheRows]]:
    """Batch a per-example step `one(token, cache) -> (logits, cache)` over `CacheRows`."""

    def per_row(token, row):
        logits, cache = one(token, to_cache(row))
        return logits, to_rows(cache)

    return jax.vmap(per_row, in_axes=(0, ROW_AXES), out_axes=(0, ROW_AXES))
