"""The one attention of zoo: masks, scaled dot-product attention, multi-head attention, KV cache.

Every model (classifier, GPT, translator) attends through this file. Everything works on one
example: sequences are `Float[Array, "seq d_model"]`; batch with `jax.vmap`.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Linear
from zoo.nn.norm import RMSNorm
from zoo.nn.rotary import RotaryEmbedding, RotaryTable

# --------------------------------------------------------------------------------------------
# masks: True means "this query may attend to this key"
# --------------------------------------------------------------------------------------------


def causal_mask(
    query_positions: Int[Array, " seq"], key_positions: Int[Array, " kv_seq"]
) -> Bool[Array, "seq kv_seq"]:
    """A query at absolute position p may attend to keys at positions <= p."""
    return key_positions[None, :] <= query_positions[:, None]


def attention_mask(
    num_queries: int,
    key_valid: Bool[Array, " kv_seq"] | None = None,
    *,
    num_keys: int | None = None,
    causal: bool = False,
    query_offset: Int[Array, ""] | int = 0,
    window: int | None = None,
) -> Bool[Array, "seq kv_seq"] | None:
    """Combine a key-padding mask and a causal mask into one `[seq, kv_seq]` mask.

    `key_valid[j]` is False for padding keys. With `causal=True`, query `i` sits at absolute
    position `query_offset + i` and sees keys at positions `<= query_offset + i` (the offset is
    how far a KV cache is already filled). A sliding `window` (causal only, Mistral) keeps the
    last `window` of those: keys at positions `> query_position - window`. Returns None when
    nothing is masked.
    """
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal=True")
    if key_valid is None and not causal:
        return None
    if num_keys is None:
        if key_valid is None:
            raise ValueError("attention_mask needs num_keys or key_valid")
        num_keys = key_valid.shape[0]
    mask = jnp.ones((num_queries, num_keys), dtype=bool)
    if causal:
        query_positions = query_offset + jnp.arange(num_queries)
        key_positions = jnp.arange(num_keys)
        mask = causal_mask(query_positions, key_positions)
        if window is not None:
            mask = mask & (key_positions[None, :] > query_positions[:, None] - window)
    if key_valid is not None:
        mask = mask & key_valid[None, :]
    return mask


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


def _fused(
    implementation: str | None,
    return_weights: bool,
    dropout: Dropout | None,
    dropout_key: PRNGKeyArray | None,
) -> bool:
    """Whether `dot_product_attention` takes `jax.nn.dot_product_attention` (see its docstring)."""
    dropout_active = (
        dropout is not None
        and dropout_key is not None
        and not dropout.inference
        and dropout.rate > 0.0
    )
    explicit_by_default = implementation is None and jax.default_backend() == "cpu"
    return not (return_weights or dropout_active or explicit_by_default)


def dot_product_attention(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq kv_heads head_dim"],
    value: Float[Array, "kv_seq kv_heads head_dim"],
    mask: Bool[Array, "seq kv_seq"] | None = None,
    *,
    score_bias: Float[Array, "heads seq kv_seq"] | None = None,
    scale: bool = True,
    dropout: Dropout | None = None,
    dropout_key: PRNGKeyArray | None = None,
    return_weights: bool = False,
    implementation: str | None = None,
    causal: bool = False,
) -> tuple[Float[Array, "seq heads head_dim"], Float[Array, "heads seq kv_seq"] | None]:
    """Scaled dot-product attention for one example; returns (output, weights or None).

    Two paths with the same result. The explicit one computes the weights (float32 softmax of
    einsum scores) and is used for attention dropout, for `return_weights`, and on the CPU by
    default, where its backward pass is faster. Otherwise `jax.nn.dot_product_attention` runs:
    `implementation="xla"` forces it on any device, `"cudnn"` asks for the cuDNN flash kernel
    on an NVIDIA GPU. Both paths give zero output for fully masked queries, and both take
    fewer key/value heads than query heads (grouped-query attention), and both add
    `score_bias` to the scores and honour `scale` (see `attention_weights`).

    `causal=True` lets query `i` see keys `0..i` only, on top of `mask` (self-attention over
    one sequence without a cache: `seq == kv_seq`). It equals passing the causal mask, but
    with no other mask the fused path hands it to the kernel as `is_causal`: cuDNN then skips
    the masked half of the scores instead of reading a `[seq, kv_seq]` bias.
    """
    fused = _fused(implementation, return_weights, dropout, dropout_key)
    if causal:
        if query.shape[0] != key.shape[0]:
            raise ValueError(
                f"causal=True needs as many queries as keys (self-attention without a cache), "
                f"got {query.shape[0]} queries and {key.shape[0]} keys; with a KV cache pass "
                "the mask instead: attention_mask(..., causal=True, query_offset=index)"
            )
        if mask is not None or not fused:
            ordered = causal_mask(jnp.arange(query.shape[0]), jnp.arange(key.shape[0]))
            mask = ordered if mask is None else mask & ordered
            causal = False
    if not fused:
        weights = attention_weights(query, key, mask, score_bias=score_bias, scale=scale)
        if dropout is not None:
            weights = dropout(weights, key=dropout_key)
        output = _weighted_values(weights.astype(value.dtype), value)
        return output, (weights if return_weights else None)

    # jax's own kernel mixes bf16 and f32 internally, which strict promotion would reject.
    with jax.numpy_dtype_promotion("standard"):
        output = jax.nn.dot_product_attention(
            query,
            key,
            value,
            bias=None if score_bias is None else score_bias.astype(query.dtype)[None],
            mask=None if mask is None else mask[None, :, :],
            scale=None if scale else 1.0,
            is_causal=causal,
            implementation=implementation,  # type: ignore[arg-type]
        )
    if mask is not None:
        any_key = jnp.any(mask, axis=-1)
        output = jnp.where(any_key[:, None, None], output, jnp.zeros_like(output))
    return output, None


# --------------------------------------------------------------------------------------------
# KV cache for incremental decoding
# --------------------------------------------------------------------------------------------


class KVCache(eqx.Module):
    """Keys and values of one self-attention layer, preallocated to `max_len` positions.

    It holds the key/value heads only: with grouped-query attention that is `kv_heads`, fewer
    than the query heads, and nothing is repeated per query head.
    """

    keys: Float[Array, "*layers max_len kv_heads head_dim"]
    values: Float[Array, "*layers max_len kv_heads head_dim"]

    @staticmethod
    def empty(max_len: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32) -> KVCache:
        shape = (max_len, num_kv_heads, head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def write(
        self,
        new_keys: Float[Array, "seq kv_heads head_dim"],
        new_values: Float[Array, "seq kv_heads head_dim"],
        index: Int[Array, ""] | int,
    ) -> KVCache:
        """Store `seq` new positions starting at position `index`."""
        start = (index, 0, 0)
        keys = jax.lax.dynamic_update_slice(self.keys, new_keys.astype(self.keys.dtype), start)
        values = jax.lax.dynamic_update_slice(
            self.values, new_values.astype(self.values.dtype), start
        )
        return KVCache(keys, values)


# --------------------------------------------------------------------------------------------
# multi-head attention
# --------------------------------------------------------------------------------------------


class MultiHeadAttention(eqx.Module):
    """Multi-head attention for one example (self- or cross-attention).

    Batch with `jax.vmap`. Query, key, value and output projections are separate `Linear`s so
    that self- and cross-attention share one code path and pretrained weights map one-to-one.
    The parts that tell today's families apart are options of this one class:
    `num_kv_heads < num_heads` (grouped-query attention; 1 is multi-query), an explicit
    `head_dim`, biases per projection (`qkv_bias`, `output_bias`), `qk_norm` (an RMSNorm over
    each head of the queries and keys, Qwen3), `rotary` (positions as rotations, Llama) and
    `scale_scores=False` (no 1/sqrt(head_dim), T5, whose relative positions come in through
    `attend(..., score_bias=...)`).
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
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_dim: int | None = None,
        use_bias: bool = True,
        qkv_bias: bool | None = None,
        output_bias: bool | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rotary: RotaryEmbedding | None = None,
        dropout_rate: float = 0.0,
        implementation: str | None = None,
        scale_scores: bool = True,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        if head_dim is None:
            if d_model % num_heads != 0:
                raise ValueError(
                    f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                    "choose num_heads dividing d_model or pass head_dim explicitly"
                )
            head_dim = d_model // num_heads
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads} "
                "(num_kv_heads=1 is multi-query attention)"
            )
        if rotary is not None and rotary.head_dim != head_dim:
            raise ValueError(f"rotary head_dim={rotary.head_dim} differs from head_dim={head_dim}")
        kv_dim = d_model if kv_dim is None else kv_dim
        q_key, k_key, v_key, o_key = jax.random.split(key, 4)
        common = dict(init_std=init_std, dtype=dtype)
        in_bias = use_bias if qkv_bias is None else qkv_bias
        out_bias = use_bias if output_bias is None else output_bias
        self.query_proj = Linear(
            d_model, num_heads * head_dim, use_bias=in_bias, key=q_key, **common
        )
        self.key_proj = Linear(
            kv_dim, num_kv_heads * head_dim, use_bias=in_bias, key=k_key, **common
        )
        self.value_proj = Linear(
            kv_dim, num_kv_heads * head_dim, use_bias=in_bias, key=v_key, **common
        )
        self.output_proj = Linear(
            num_heads * head_dim, d_model, use_bias=out_bias, key=o_key, **common
        )
        self.query_norm = RMSNorm(head_dim, eps=norm_eps, dtype=dtype) if qk_norm else None
        self.key_norm = RMSNorm(head_dim, eps=norm_eps, dtype=dtype) if qk_norm else None
        self.rotary = rotary
        self.dropout = Dropout(dropout_rate)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.implementation = implementation
        self.scale_scores = scale_scores

    def _split_heads(self, x: Float[Array, "seq inner"], heads: int) -> Array:
        return x.reshape(x.shape[0], heads, self.head_dim)

    def _position(
        self,
        x: Array,
        norm: RMSNorm | None,
        positions: Int[Array, " seq"] | None,
        rotary_table: RotaryTable | None,
    ) -> Array:
        """QK-norm, then the rotary rotation: by `rotary_table` if given, else by `positions`
        (default 0, 1, ...)."""
        if norm is not None:
            x = norm(x)
        if self.rotary is not None:
            if rotary_table is None and positions is None:
                positions = jnp.arange(x.shape[0])
            x = self.rotary(x, positions, table=rotary_table)
        return x

    def rotary_table(
        self,
        positions: Int[Array, " seq"] | None = None,
        *,
        length: int | None = None,
        offset: Int[Array, ""] | int = 0,
    ) -> RotaryTable | None:
        """The cos/sin table of `positions` for `project_query` and `project_key_value` (None
        without rotary): compute it once for the queries, the keys and every layer. Without
        `positions`, the `length` positions from `offset` (a KV cache's index)."""
        if self.rotary is None:
            return None
        if positions is None:
            if length is None:
                raise ValueError("rotary_table needs positions or a length")
            positions = offset + jnp.arange(length)
        return self.rotary.table(positions)

    def project_query(
        self,
        x: Float[Array, "seq d_model"],
        positions: Int[Array, " seq"] | None = None,
        *,
        rotary_table: RotaryTable | None = None,
    ) -> Float[Array, "seq heads head_dim"]:
        """Queries of `x`; with rotary, rotated by `positions` (absolute token indices) or by
        their precomputed `rotary_table` (see `rotary_table`)."""
        query = self._split_heads(self.query_proj(x), self.num_heads)
        return self._position(query, self.query_norm, positions, rotary_table)

    def project_key_value(
        self,
        context: Float[Array, "kv_seq d_kv"],
        positions: Int[Array, " kv_seq"] | None = None,
        *,
        rotary_table: RotaryTable | None = None,
    ) -> tuple[Float[Array, "kv_seq kv_heads head_dim"], Float[Array, "kv_seq kv_heads head_dim"]]:
        """Keys and values of `context`: computed once per source for cross-attention. With
        rotary the keys are rotated like the queries (`positions` or `rotary_table`)."""
        keys = self._split_heads(self.key_proj(context), self.num_kv_heads)
        values = self._split_heads(self.value_proj(context), self.num_kv_heads)
        return self._position(keys, self.key_norm, positions, rotary_table), values

    def attend(
        self,
        query: Float[Array, "seq heads head_dim"],
        keys: Float[Array, "kv_seq kv_heads head_dim"],
        values: Float[Array, "kv_seq kv_heads head_dim"],
        mask: Bool[Array, "seq kv_seq"] | None = None,
        *,
        score_bias: Float[Array, "heads seq kv_seq"] | None = None,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], Float[Array, "heads seq kv_seq"] | None]:
        """Attend projected queries to projected keys/values and apply the output projection.

        `score_bias` is added to every head's scores (relative positions,
        `zoo.nn.relative_position`). `causal` adds the causal order to `mask` (see
        `dot_product_attention`).
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
            causal=causal,
        )
        merged = heads.reshape(heads.shape[0], self.num_heads * self.head_dim)
        return self.output_proj(merged), weights

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        context: Float[Array, "kv_seq d_kv"] | None = None,
        *,
        mask: Bool[Array, "seq kv_seq"] | None = None,
        positions: Int[Array, " seq"] | None = None,
        rotary_table: RotaryTable | None = None,
        key: PRNGKeyArray | None = None,
        causal: bool = False,
    ) -> Float[Array, "seq d_model"]:
        """Self-attention over `x` (at `positions`, or rotated by their precomputed
        `rotary_table`), or cross-attention from `x` to `context`."""
        if context is None:
            if rotary_table is None:
                rotary_table = self.rotary_table(positions, length=x.shape[0])
            keys, values = self.project_key_value(x, rotary_table=rotary_table)
            query = self.project_query(x, rotary_table=rotary_table)
        else:
            keys, values = self.project_key_value(context)
            query = self.project_query(x, positions, rotary_table=rotary_table)
        output, _ = self.attend(query, keys, values, mask, key=key, causal=causal)
        return output
