"""The KV cache of incremental decoding: keys and values preallocated, filled from the front.

A decoder block writes each step's keys and values at `index` (`KVCache.write`); the model moves
the index once per step (`KVCache.advance`). The attention reads the whole cache under a mask
whose `offset` is the index (`zoo.nn.Mask`), so the unfilled end is never seen.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class KVCache(eqx.Module):
    """Keys and values preallocated to `max_len` positions, and how many are filled (`index`).

    One type for one layer (`[max_len, kv_heads, head_dim]`) and for a stack of layers (a
    leading `layers` axis, one index for all). It holds the key/value heads only: with
    grouped-query attention that is `kv_heads`, fewer than the query heads, and nothing is
    repeated per query head.
    """

    keys: Float[Array, "*layers max_len kv_heads head_dim"]
    values: Float[Array, "*layers max_len kv_heads head_dim"]
    index: Int[Array, ""]

    @staticmethod
    def empty(
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype=jnp.float32,
        *,
        layers: int | None = None,
    ) -> KVCache:
        """A cache with nothing filled (index 0), for one layer or `layers` stacked."""
        shape: tuple[int, ...] = (max_len, num_kv_heads, head_dim)
        if layers is not None:
            shape = (layers, *shape)
        zero = jnp.zeros((), jnp.int32)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), zero)

    @property
    def capacity(self) -> int:
        """Positions the cache holds (`max_len`)."""
        return self.keys.shape[-3]

    def write(
        self,
        new_keys: Float[Array, "seq kv_heads head_dim"],
        new_values: Float[Array, "seq kv_heads head_dim"],
    ) -> KVCache:
        """Store `seq` new positions from `index` on (the index moves with `advance`)."""
        start = (self.index, 0, 0)
        keys = jax.lax.dynamic_update_slice(self.keys, new_keys.astype(self.keys.dtype), start)
        values = jax.lax.dynamic_update_slice(
            self.values, new_values.astype(self.values.dtype), start
        )
        return KVCache(keys, values, self.index)

    def advance(self, count: int) -> KVCache:
        """The same cache with `count` more positions counted as filled."""
        return KVCache(self.keys, self.values, self.index + count)

    def layer(self, index: int | Int[Array, ""]) -> KVCache:
        """Layer `index` of a stacked cache."""
        return KVCache(self.keys[index], self.values[index], self.index)
