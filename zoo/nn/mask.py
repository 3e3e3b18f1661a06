"""The one mask value of zoo: which keys each query of one example may attend to.

A `Mask` says it in the terms attention kernels understand, so that no `[seq, kv_seq]` array
is built where a length or a flag says the same thing:

- `causal`: query `i` sits at key position `offset + i` and sees keys at or before it;
- `window`: of those, only the last `window` (Mistral's sliding window); without `causal`,
  the keys less than `window` positions away on either side (ModernBERT's local layers:
  `|i - j| <= window - 1`);
- `offset`: how many keys come before the first query (a KV cache's fill); None means 0 and
  that it is known when tracing, which fused kernels need for their causal order;
- `key_length` / `query_length`: keys (queries) at index `>= length` are padding, or the
  unfilled end of a cache;
- `query_segments` / `key_segments`: packed sequences, a query sees keys of its own segment;
- `explicit`: any boolean `[seq, kv_seq]` array, ANDed with the rest (the general case).

A mask says itself in `jax.nn.dot_product_attention`'s own arguments (`is_causal`,
`query_seq_lengths`, `key_value_seq_lengths`, `local_window_size`) where it can
(`Mask.kernel_arguments`, which `zoo.nn.kernel` hands to the fused kernels) and as an array
(`Mask.array`) where it cannot.

Padding described per token (`tokens != pad_id`, or a user's mask) is not a length unless it
sits at the end. `Compaction` moves a sequence's real tokens to the front, in order, so that
its padding becomes a length; the model runs on the compacted sequence and puts the outputs
back (what FlashAttention's "unpad" does for variable-length batches).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


class KernelArguments(NamedTuple):
    """A mask in `jax.nn.dot_product_attention`'s terms, for one example (lengths of shape 1)."""

    is_causal: bool
    query_seq_lengths: Int[Array, " 1"] | None
    key_value_seq_lengths: Int[Array, " 1"] | None
    local_window_size: tuple[int, int] | None


class Mask(eqx.Module):
    """Which keys each query of one example may attend to (see the module docstring).

    Build it with keywords; every part is optional and parts combine with AND. `Mask()` masks
    nothing.
    """

    causal: bool = eqx.field(static=True, default=False)
    window: int | None = eqx.field(static=True, default=None)
    offset: Int[Array, ""] | None = None
    key_length: Int[Array, ""] | None = None
    query_length: Int[Array, ""] | None = None
    query_segments: Int[Array, " seq"] | None = None
    key_segments: Int[Array, " kv_seq"] | None = None
    explicit: Bool[Array, "seq kv_seq"] | None = None

    def __check_init__(self) -> None:
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if self.offset is not None and not self.causal:
            raise ValueError("offset places queries for the causal order: it needs causal=True")
        if (self.query_segments is None) != (self.key_segments is None):
            raise ValueError("pass query_segments and key_segments together")

    @staticmethod
    def keys(
        valid: Bool[Array, " kv_seq"], num_queries: int, *, causal: bool = False, **parts
    ) -> Mask:
        """Every query sees the keys where `valid` is True (and `parts`, e.g. a window).

        Padding anywhere, said as an explicit array: padding at the end is better said by
        `key_length` (or moved there by `Compaction`), which fused kernels take as it is.
        """
        explicit = jnp.broadcast_to(valid.astype(bool)[None, :], (num_queries, valid.shape[0]))
        return Mask(causal=causal, explicit=explicit, **parts)

    @property
    def is_empty(self) -> bool:
        """True when the mask lets every query see every key."""
        parts = (self.key_length, self.query_length, self.key_segments, self.explicit)
        windowed = self.causal or self.window is not None
        return not windowed and all(part is None for part in parts)

    def replace(self, **changes) -> Mask:
        """A copy with some parts changed (`Mask` is immutable), checked as a new mask is."""
        return dataclasses.replace(self, **changes)

    def limit_keys(self, length: Int[Array, ""] | int) -> Mask:
        """The same mask with keys at index `>= length` masked too."""
        length = jnp.asarray(length, jnp.int32)
        if self.key_length is not None:
            length = jnp.minimum(length, self.key_length)
        return self.replace(key_length=length)

    def array(self, num_queries: int, num_keys: int) -> Bool[Array, "seq kv_seq"] | None:
        """The mask as a boolean `[seq, kv_seq]` array (True = may attend); None if empty."""
        if self.is_empty:
            return None
        allowed = jnp.ones((num_queries, num_keys), bool)
        key_index = jnp.arange(num_keys)
        query_index = jnp.arange(num_queries)
        if self.causal:
            query_position = query_index if self.offset is None else self.offset + query_index
            allowed = key_index[None, :] <= query_position[:, None]
            if self.window is not None:
                allowed = allowed & (key_index[None, :] > query_position[:, None] - self.window)
        elif self.window is not None:  # two-sided: less than `window` positions either way
            distance = jnp.abs(key_index[None, :] - query_index[:, None])
            allowed = distance < self.window
        if self.key_length is not None:
            allowed = allowed & (key_index < self.key_length)[None, :]
        if self.query_length is not None:
            allowed = allowed & (query_index < self.query_length)[:, None]
        if self.query_segments is not None and self.key_segments is not None:
            allowed = allowed & (self.query_segments[:, None] == self.key_segments[None, :])
        if self.explicit is not None:
            if self.explicit.shape != (num_queries, num_keys):
                raise ValueError(
                    f"the explicit mask has shape {tuple(self.explicit.shape)}, but there are "
                    f"{num_queries} queries and {num_keys} keys"
                )
            allowed = allowed & self.explicit
        return allowed

    def kernel_arguments(self, num_queries: int, num_keys: int) -> KernelArguments | None:
        """This mask as `jax.nn.dot_product_attention` arguments, or None if it needs an array.

        Segments and explicit arrays need the array. A causal order whose offset is only known
        at run time (a KV cache) is expressible for a single query (its keys are a prefix of
        length `offset + 1`) without a window; for more queries it needs the array.
        """
        if self.explicit is not None or self.key_segments is not None:
            return None
        key_length = self.key_length
        is_causal = self.causal
        if self.causal and self.offset is not None:
            if num_queries != 1 or self.window is not None:
                return None
            visible = self.offset + 1
            key_length = visible if key_length is None else jnp.minimum(key_length, visible)
            is_causal = False
        elif self.causal and num_queries != num_keys and key_length is None:
            # the kernels align the causal order at the top left: query i sees keys <= i
            key_length = jnp.asarray(num_queries, jnp.int32)
        window = None
        if self.window is not None and not self.causal:
            window = (self.window - 1, self.window - 1)  # two-sided
        elif self.window is not None and is_causal:
            window = (self.window - 1, 0)
        return KernelArguments(
            is_causal=is_causal,
            query_seq_lengths=_as_lengths(self.query_length),
            key_value_seq_lengths=_as_lengths(key_length),
            local_window_size=window,
        )


def as_mask(mask: Mask | Bool[Array, "seq kv_seq"] | None) -> Mask:
    """A `Mask` from a mask value, a boolean `[seq, kv_seq]` array (True = may attend) or None."""
    if mask is None:
        return Mask()
    if isinstance(mask, Mask):
        return mask
    return Mask(explicit=mask)


def _as_lengths(length: Int[Array, ""] | None) -> Int[Array, " 1"] | None:
    return None if length is None else jnp.reshape(length, (1,)).astype(jnp.int32)


class Compaction(eqx.Module):
    """Real tokens first, in order: turns per-token padding into a length.

    `order[i]` is the original index of compacted position `i`; `length` is the number of real
    tokens. `gather` reorders along an axis, `scatter` puts results back. A sequence padded
    only at its end compacts to itself.
    """

    order: Int[Array, " seq"]
    length: Int[Array, ""]

    @staticmethod
    def of(valid: Bool[Array, " seq"]) -> Compaction:
        """The compaction of a sequence whose real tokens are `valid`."""
        # A stable sort of "is padding" keeps the real tokens' order, then the padding's.
        order = jnp.argsort(~valid, stable=True)
        return Compaction(order.astype(jnp.int32), jnp.sum(valid, dtype=jnp.int32))

    def gather(self, values: Array, axis: int = 0) -> Array:
        """`values` in compacted order along `axis`."""
        return jnp.take(values, self.order, axis=axis)

    def scatter(self, values: Array, axis: int = 0) -> Array:
        """Compacted `values` back in the original order along `axis`."""
        inverse = jnp.zeros_like(self.order).at[self.order].set(jnp.arange(self.order.shape[0]))
        return jnp.take(values, inverse, axis=axis)
