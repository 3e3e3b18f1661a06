"""The one attention of zoo: scaled dot-product attention, multi-head attention, KV cache.

Every model (classifier, GPT, translator) attends through this file. Everything works on one
example: sequences are `Float[Array, "seq d_model"]`; batch with `jax.vmap`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.kernel import IMPLEMENTATIONS, choose_kernel
from zoo.nn.linear import Init, Linear
from zoo.nn.mask import KernelArguments, Mask
from zoo.nn.norm import RMSNorm
from zoo.nn.rotary import Rope, RotaryEmbedding, RotaryTable

# --------------------------------------------------------------------------------------------
# scaled dot-product attention
# --------------------------------------------------------------------------------------------


def _groups(query: Array, key: Array) -> int:
    """How many query heads share each key/value head (1 without grouped-query attention)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads != 0:
        raise ValueError(
            f"{heads} query heads cannot share {kv_heads} key/value heads: the number of "
            "key/value heads must divide the number of query heads"
        )
    return heads // kv_heads


def attention_weights(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq kv_heads head_dim"],
    mask: Bool[Array, "seq kv_seq"] | None = None,
    *,
    score_bias: Float[Array, "heads seq kv_seq"] | None = None,
    scale: bool = True,
) -> Float[Array, "heads seq kv_seq"]:
    """softmax(q k^T / sqrt(head_dim) + score_bias) per head, in float32.

    `score_bias` is added to the scaled scores (T5's relative positions); `scale=False` leaves
    out the 1/sqrt(head_dim) (T5 folds it into its initialisation). With grouped-query
    attention (`kv_heads < heads`), query head `h` reads key head `h // (heads // kv_heads)`;
    the shared keys are never copied. Masked keys get weight exactly
    0. A query whose keys are all masked gets an all-zero row (finite values and gradients,
    never NaN).
    """
    group = _groups(query, key)
    if group == 1:
        scores = jnp.einsum("qhd,khd->hqk", query, key)
    else:
        seq, heads, head_dim = query.shape
        grouped = query.reshape(seq, key.shape[1], group, head_dim)
        scores = jnp.einsum("qkgd,skd->kgqs", grouped, key).reshape(heads, seq, key.shape[0])
    scores = scores.astype(jnp.float32)
    if scale:
        scores = scores * (1.0 / math.sqrt(query.shape[-1]))
    if score_bias is not None:
        scores = scores + score_bias.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    # A finite fill keeps fully masked rows finite (uniform), and the final `where` zeroes them.
    fill = np.float32(np.finfo(np.float32).min)
    scores = jnp.where(mask[None, :, :], scores, fill)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask[None, :, :], weights, jnp.zeros_like(weights))


def _weighted_values(
    weights: Float[Array, "heads seq kv_seq"], value: Float[Array, "kv_seq kv_heads head_dim"]
) -> Float[Array, "seq heads head_dim"]:
    heads, seq, kv_seq = weights.shape
    kv_heads = value.shape[1]
    if heads == kv_heads:
        return jnp.einsum("hqk,khd->qhd", weights, value)
    grouped = weights.reshape(kv_heads, heads // kv_heads, seq, kv_seq)
    output = jnp.einsum("kgqs,skd->qkgd", grouped, value)
    return output.reshape(seq, heads, value.shape[2])


def as_mask(mask: Mask | Bool[Array, "seq kv_seq"] | None) -> Mask:
    """A `Mask` from a mask value, a boolean `[seq, kv_seq]` array (True = may attend) or None."""
    if mask is None:
        return Mask()
    if isinstance(mask, Mask):
        return mask
    return Mask(explicit=mask)


def dot_product_attention(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq kv_heads head_dim"],
    value: Float[Array, "kv_seq kv_heads head_dim"],
    mask: Mask | Bool[Array, "seq kv_seq"] | None = None,
    *,
    score_bias: Float[Array, "heads seq kv_seq"] | None = None,
    scale: bool = True,
    dropout: Dropout | None = None,
    dropout_key: PRNGKeyArray | None = None,
    return_weights: bool = False,
    implementation: str | None = None,
) -> tuple[Float[Array, "seq heads head_dim"], Float[Array, "heads seq kv_seq"] | None]:
    """Scaled dot-product attention for one example; returns (output, weights or None).

    `mask` is a `zoo.nn.Mask` (causal order, lengths, window, cache offset, segments) or a
    boolean `[seq, kv_seq]` array. `zoo.nn.kernel.choose_kernel` picks the kernel from
    `implementation` (None: by platform; "explicit", "xla", "cudnn"): zoo's explicit float32
    softmax (attention dropout, `return_weights`, the CPU by default) or
    `jax.nn.dot_product_attention`, which gets the mask as its own arguments (`is_causal`,
    sequence lengths, `local_window_size`) where the mask can be said that way, so cuDNN runs
    its causal and padding kernels without reading a `[seq, kv_seq]` array. Every kernel
    gives the same result: zero output for queries that see no key, grouped-query attention
    (fewer key/value heads), `score_bias` added to the scaled scores and `scale` honoured
    (see `attention_weights`).
    """
    mask = as_mask(mask)
    num_queries, num_keys = query.shape[0], key.shape[0]
    dropout_active = (
        dropout is not None
        and dropout_key is not None
        and not dropout.inference
        and dropout.rate > 0.0
    )
    arguments = mask.kernel_arguments(num_queries, num_keys)
    kernel = choose_kernel(
        implementation,
        query=query,
        key=key,
        mask_arguments=arguments,
        has_score_bias=score_bias is not None,
        return_weights=return_weights,
        dropout_active=dropout_active,
    )
    if kernel == "explicit":
        weights = attention_weights(
            query, key, mask.array(num_queries, num_keys), score_bias=score_bias, scale=scale
        )
        if dropout is not None:
            weights = dropout(weights, key=dropout_key)
        output = _weighted_values(weights.astype(value.dtype), value)
        return output, (weights if return_weights else None)
    return _fused_attention(query, key, value, mask, arguments, score_bias, scale, kernel), None


def _fused_attention(query, key, value, mask, arguments, score_bias, scale, kernel):
    """`jax.nn.dot_product_attention` with the mask as its own arguments, or as an array."""
    num_queries, num_keys = query.shape[0], key.shape[0]
    mask_array = None
    if arguments is None:
        mask_array = mask.array(num_queries, num_keys)
        arguments = KernelArguments(False, None, None, None)
        answered = jnp.any(mask_array, axis=-1)
    else:
        answered = _answered_queries(arguments, num_queries)
    # the fused kernels take one dtype (a float32 cache read by bf16 queries)
    key, value = key.astype(query.dtype), value.astype(query.dtype)
    query_lengths, key_lengths = arguments.query_seq_lengths, arguments.key_value_seq_lengths
    if key_lengths is not None:
        # a query with no key is zeroed below; the kernel always gets one key to read
        key_lengths = jnp.maximum(key_lengths, 1)
    if kernel == "cudnn":
        if key_lengths is not None and query_lengths is None:
            query_lengths = jnp.full((1,), num_queries, jnp.int32)
        if query_lengths is not None and key_lengths is None:
            key_lengths = jnp.full((1,), num_keys, jnp.int32)
        key, value, query_lengths, key_lengths = _batched_like(
            query, key, value, query_lengths, key_lengths
        )
    # jax's own kernel mixes bf16 and f32 internally, which strict promotion would reject.
    with jax.numpy_dtype_promotion("standard"):
        output = jax.nn.dot_product_attention(
            query,
            key,
            value,
            bias=None if score_bias is None else score_bias.astype(query.dtype)[None],
            mask=None if mask_array is None else mask_array[None, :, :],
            scale=None if scale else 1.0,
            is_causal=arguments.is_causal,
            query_seq_lengths=query_lengths,
            key_value_seq_lengths=key_lengths,
            local_window_size=arguments.local_window_size,
            implementation=kernel,
        )
    if answered is None:
        return output
    return jnp.where(answered[:, None, None], output, jnp.zeros_like(output))


def _batched_like(query: Array, *operands: Array | None) -> list[Array | None]:
    """`operands` plus a zero computed from `query`, so that under `jax.vmap` they carry the
    queries' batch axis.

    cuDNN's batching rule reshapes every operand to the queries' batch; one that does not vary
    over the batch (a length known when tracing, a cross-attention memory shared by every
    beam) has no batch axis and cannot be reshaped. The zero is the same select on both sides,
    which XLA removes.
    """
    zero = jnp.where(jnp.isnan(query[0, 0, 0]), 0, 0).astype(jnp.int32)
    return [
        None if operand is None else operand + zero.astype(operand.dtype) for operand in operands
    ]


def _answered_queries(arguments: KernelArguments, num_queries: int) -> Bool[Array, " seq"] | None:
    """Which queries see at least one key under a mask said in lengths (None: all of them)."""
    answered = None
    if arguments.query_seq_lengths is not None:
        answered = jnp.arange(num_queries) < arguments.query_seq_lengths[0]
    if arguments.key_value_seq_lengths is not None:
        any_key = jnp.broadcast_to(arguments.key_value_seq_lengths[0] > 0, (num_queries,))
        answered = any_key if answered is None else answered & any_key
    return answered


# --------------------------------------------------------------------------------------------
# KV cache for incremental decoding
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# multi-head attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttentionSettings:
    """What a `MultiHeadAttention` is, besides its width and initialisation.

    `num_kv_heads < num_heads` is grouped-query attention (1: multi-query); `head_dim` None is
    `d_model // num_heads`; biases per projection (`qkv_bias`, `output_bias`); `qk_norm` is an
    RMSNorm over each head of the queries and keys (Qwen3); `rope` rotates queries and keys by
    their positions (Llama); `scale_scores=False` leaves out the 1/sqrt(head_dim) (T5, whose
    relative positions come in as a score bias); `implementation` picks the kernel
    (`zoo.nn.kernel`: None by platform, "explicit", "xla", "cudnn").
    """

    num_heads: int  # query heads
    num_kv_heads: int | None = None  # key/value heads (must divide num_heads); None: num_heads
    head_dim: int | None = None  # per-head width; None: d_model // num_heads
    qkv_bias: bool = True  # biases on the query, key and value projections
    output_bias: bool = True  # bias on the output projection
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (before rotary)
    norm_eps: float = 1e-6  # epsilon of the QK-norm
    dropout: float = 0.0  # dropout on the attention weights
    implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    scale_scores: bool = True  # divide scores by sqrt(head_dim)
    rope: Rope | None = None  # rotary positions; None: positions come in elsewhere

    def __post_init__(self) -> None:
        kv_heads = self.kv_heads
        if self.num_heads < 1 or kv_heads < 1 or self.num_heads % kv_heads != 0:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} "
                "(num_kv_heads=1 is multi-query attention)"
            )
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention implementation must be one of {IMPLEMENTATIONS}, got "
                f"{self.implementation!r}"
            )

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def width(self, d_model: int) -> int:
        """The per-head width for a model of width `d_model`."""
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}; "
                "choose num_heads dividing d_model or set head_dim"
            )
        return d_model // self.num_heads


class MultiHeadAttention(eqx.Module):
    """Multi-head attention for one example (self- or cross-attention).

    Batch with `jax.vmap`. Query, key, value and output projections are separate `Linear`s so
    that self- and cross-attention share one code path and pretrained weights map one-to-one.
    What tells today's families apart is its `AttentionSettings`.
    """

    query_proj: Linear
    key_proj: Linear
    value_proj: Linear
    output_proj: Linear
    query_norm: RMSNorm | None
    key_norm: RMSNorm | None
    rotary: RotaryEmbedding | None
    dropout: Dropout
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    implementation: str | None = eqx.field(static=True)
    scale_scores: bool = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        settings: AttentionSettings,
        *,
        kv_dim: int | None = None,
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        """`kv_dim` is the width of what cross-attention reads (default `d_model`)."""
        s, init = settings, Init() if init is None else init
        head_dim = s.width(d_model)
        kv_dim = d_model if kv_dim is None else kv_dim
        q_key, k_key, v_key, o_key = jax.random.split(key, 4)
        self.query_proj = init.linear(d_model, s.num_heads * head_dim, s.qkv_bias, key=q_key)
        self.key_proj = init.linear(kv_dim, s.kv_heads * head_dim, s.qkv_bias, key=k_key)
        self.value_proj = init.linear(kv_dim, s.kv_heads * head_dim, s.qkv_bias, key=v_key)
        self.output_proj = init.linear(s.num_heads * head_dim, d_model, s.output_bias, key=o_key)
        self.query_norm = RMSNorm(head_dim, eps=s.norm_eps, dtype=init.dtype) if s.qk_norm else None
        self.key_norm = RMSNorm(head_dim, eps=s.norm_eps, dtype=init.dtype) if s.qk_norm else None
        self.rotary = None if s.rope is None else RotaryEmbedding(head_dim, s.rope)
        self.dropout = Dropout(s.dropout)
        self.num_heads = s.num_heads
        self.num_kv_heads = s.kv_heads
        self.head_dim = head_dim
        self.implementation = s.implementation
        self.scale_scores = s.scale_scores

    def _split_heads(self, x: Float[Array, "seq inner"], heads: int) -> Array:
        return x.reshape(x.shape[0], heads, self.head_dim)

    def _position(self, x: Array, norm: RMSNorm | None, rotary_table: RotaryTable | None) -> Array:
        """QK-norm, then the rotary rotation by the table of the positions."""
        if norm is not None:
            x = norm(x)
        if self.rotary is not None:
            if rotary_table is None:
                raise ValueError(
                    "this attention rotates by positions: pass the rotary table of the "
                    "positions (MultiHeadAttention.rotary_table)"
                )
            x = self.rotary(x, rotary_table)
        return x

    def rotary_table(
        self,
        positions: Int[Array, " seq"] | None = None,
        *,
        length: int | None = None,
        offset: Int[Array, ""] | int = 0,
    ) -> RotaryTable | None:
        """The cos/sin table of `positions` (None without rotary): made once for the queries,
        the keys and every layer. Without `positions`, the `length` positions from `offset`
        (a KV cache's index)."""
        if self.rotary is None:
            return None
        if positions is None:
            if length is None:
                raise ValueError("rotary_table needs positions or a length")
            positions = offset + jnp.arange(length)
        return self.rotary.table(positions)

    def project_query(
        self, x: Float[Array, "seq d_model"], rotary_table: RotaryTable | None = None
    ) -> Float[Array, "seq heads head_dim"]:
        """Queries of `x`; with rotary, rotated by the `rotary_table` of their positions."""
        query = self._split_heads(self.query_proj(x), self.num_heads)
        return self._position(query, self.query_norm, rotary_table)

    def project_key_value(
        self, context: Float[Array, "kv_seq d_kv"], rotary_table: RotaryTable | None = None
    ) -> tuple[Float[Array, "kv_seq kv_heads head_dim"], Float[Array, "kv_seq kv_heads head_dim"]]:
        """Keys and values of `context`: computed once per source for cross-attention. With
        rotary the keys are rotated like the queries."""
        keys = self._split_heads(self.key_proj(context), self.num_kv_heads)
        values = self._split_heads(self.value_proj(context), self.num_kv_heads)
        return self._position(keys, self.key_norm, rotary_table), values

    def attend(
        self,
        query: Float[Array, "seq heads head_dim"],
        keys: Float[Array, "kv_seq kv_heads head_dim"],
        values: Float[Array, "kv_seq kv_heads head_dim"],
        mask: Mask | Bool[Array, "seq kv_seq"] | None = None,
        *,
        score_bias: Float[Array, "heads seq kv_seq"] | None = None,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], Float[Array, "heads seq kv_seq"] | None]:
        """Attend projected queries to projected keys/values and apply the output projection.

        `mask` is a `zoo.nn.Mask` or a boolean `[seq, kv_seq]` array (see
        `dot_product_attention`). `score_bias` is added to every head's scores (relative
        positions, `zoo.nn.relative_position`).
        """
        heads, weights = dot_product_attention(
            query,
            keys,
            values,
            mask,
            score_bias=score_bias,
            scale=self.scale_scores,
            dropout=self.dropout,
            dropout_key=key,
            return_weights=return_weights,
            implementation=self.implementation,
        )
        merged = heads.reshape(heads.shape[0], self.num_heads * self.head_dim)
        return self.output_proj(merged), weights

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        context: Float[Array, "kv_seq d_kv"] | None = None,
        *,
        mask: Mask | Bool[Array, "seq kv_seq"] | None = None,
        positions: Int[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq d_model"]:
        """Self-attention over `x` (with rotary, at `positions`, default 0, 1, ...), or
        cross-attention from `x` to `context` (no rotation)."""
        if context is None:
            table = self.rotary_table(positions, length=x.shape[0])
            keys, values = self.project_key_value(x, table)
            query = self.project_query(x, table)
        else:
            keys, values = self.project_key_value(context)
            query = self.project_query(x, self.rotary_table(positions, length=x.shape[0]))
        output, _ = self.attend(query, keys, values, mask, key=key)
        return output
