"""T5's relative position bias: a learned scalar per head and distance bucket, added to the scores.

Nothing is added to the embeddings. The key-minus-query distance of every (query, key) pair
falls into one of `num_buckets` buckets: exact buckets for small distances, logarithmically
wider ones up to `max_distance`, beyond which all distances share the last bucket. In the
encoder (`bidirectional=True`) half the buckets are for keys after the query; in the decoder
(causal) only keys at or before the query count. A model computes the `[heads, seq, kv_seq]`
bias once per forward pass and every layer adds the same bias to its attention scores
(`MultiHeadAttention.attend(..., score_bias=...)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.linear import Init


def relative_position_buckets(
    relative_position: Int[Array, "*shape"],
    *,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Int[Array, "*shape"]:
    """The bucket of each `key_position - query_position`, in `[0, num_buckets)` (T5's rule).

    Bidirectional: buckets `[0, num_buckets/2)` for keys at or before the query, the upper half
    for keys after it. Causal: keys after the query (never attended to) share bucket 0 with
    distance 0. Of the buckets of one direction, the first half are exact distances; the rest
    grow logarithmically up to `max_distance`.
    """
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(relative_position.dtype) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # float32 and this order of operations, as in Mesh TensorFlow and transformers, so that
    # distances on a bucket boundary land in the same bucket
    ratio = jnp.maximum(distance, 1).astype(jnp.float32) / max_exact
    spread = jnp.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = jnp.minimum(max_exact + spread.astype(distance.dtype), num_buckets - 1)
    return buckets + jnp.where(is_small, distance, large)


def check_relative_buckets(num_buckets: int, max_distance: int, *, bidirectional: bool) -> None:
    """Raise unless the bucket settings give each direction exact and logarithmic buckets."""
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if not isinstance(num_buckets, int) or per_direction < 2:
        raise ValueError(
            f"num_buckets={num_buckets!r} is too few: relative positions need at least 2 "
            "buckets per direction (T5 uses 32)"
        )
    if not isinstance(max_distance, int) or max_distance <= per_direction // 2:
        raise ValueError(
            f"max_distance={max_distance!r} must exceed the exact buckets ({per_direction // 2}); "
            "T5 uses 128"
        )


@dataclass(frozen=True, kw_only=True)
class RelativePositions:
    """T5's relative positions: a bias per head and distance bucket on the attention scores."""

    num_buckets: int = 32  # distance buckets per table (T5: 32)
    max_distance: int = 128  # distances beyond it share the last bucket (T5: 128)

    def __post_init__(self) -> None:
        for bidirectional in (True, False):  # the encoder's table, then the decoder's
            check_relative_buckets(self.num_buckets, self.max_distance, bidirectional=bidirectional)


class RelativePositionBias(eqx.Module):
    """A `[num_buckets, heads]` table giving each head a score bias per distance bucket.

    Args:
        num_heads: the attention heads, one bias per head and bucket.
        bidirectional: True for an encoder (keys on both sides), False for a causal decoder.
        num_buckets: distance buckets (T5: 32).
        max_distance: distances beyond it share the last bucket (T5: 128).
        init: how the table is drawn, and its dtype (a config's `init`); None: `Init()`.
        key: the table's random key.
    """

    weight: Float[Array, "buckets heads"]
    bidirectional: bool = eqx.field(static=True)
    num_buckets: int = eqx.field(static=True)
    max_distance: int = eqx.field(static=True)

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool,
        num_buckets: int = 32,
        max_distance: int = 128,
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        init = Init() if init is None else init
        check_relative_buckets(num_buckets, max_distance, bidirectional=bidirectional)
        self.weight = init.normal(key, (num_buckets, num_heads))
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance

    def __call__(
        self, query_positions: Int[Array, " seq"], key_positions: Int[Array, " kv_seq"]
    ) -> Float[Array, "heads seq kv_seq"]:
        """The bias of every head for queries and keys at these absolute positions."""
        relative = key_positions[None, :] - query_positions[:, None]
        buckets = relative_position_buckets(
            relative,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return jnp.transpose(self.weight[buckets], (2, 0, 1))
