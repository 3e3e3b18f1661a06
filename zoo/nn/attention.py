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
) -> Bool[Array, "seq kv_seq"] | None:
    """Combine a key-padding mask and a causal mask into one `[seq, kv_seq]` mask.

    `key_valid[j]` is False for padding keys. With `causal=True`, query `i` sits at absolute
    position `query_offset + i` and sees keys at positions `<= query_offset + i` (the offset is
    how far a KV cache is already filled). Returns None when nothing is masked.
    """
    if key_valid is None and not causal:
        return None
    if num_keys is None:
        if key_valid is None:
            raise ValueError("attention_mask needs num_keys or key_valid")
        num_keys = key_valid.shape[0]
    mask = jnp.ones((num_queries, num_keys), dtype=bool)
    if causal:
        query_positions = query_offset + jnp.arange(num_queries)
        mask = causal_mask(query_positions, jnp.arange(num_keys))
    if key_valid is not None:
        mask = mask & key_valid[None, :]
    return mask


# --------------------------------------------------------------------------------------------
# scaled dot-product attention
# --------------------------------------------------------------------------------------------


def attention_weights(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq heads head_dim"],
    mask: Bool[Array, "seq kv_seq"] | None = None,
) -> Float[Array, "heads seq kv_seq"]:
    """softmax(q k^T / sqrt(head_dim)) per head, in float32.

    Masked keys get weight exactly 0. A query whose keys are all masked gets an all-zero row
    (finite values and gradients, never NaN).
    """
    scale = 1.0 / math.sqrt(query.shape[-1])
    scores = jnp.einsum("qhd,khd->hqk", query, key).astype(jnp.float32) * scale
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    # A finite fill keeps fully masked rows finite (uniform), and the final `where` zeroes them.
    fill = np.float32(np.finfo(np.float32).min)
    scores = jnp.where(mask[None, :, :], scores, fill)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask[None, :, :], weights, jnp.zeros_like(weights))


def dot_product_attention(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq heads head_dim"],
    value: Float[Array, "kv_seq heads head_dim"],
    mask: Bool[Array, "seq kv_seq"] | None = None,
    *,
    dropout: Dropout | None = None,
    dropout_key: PRNGKeyArray | None = None,
    return_weights: bool = False,
    implementation: str | None = None,
) -> tuple[Float[Array, "seq heads head_dim"], Float[Array, "heads seq kv_seq"] | None]:
    """Scaled dot-product attention for one example; returns (output, weights or None).

    Two paths with the same result. The explicit one computes the weights (float32 softmax of
    einsum scores) and is used for attention dropout, for `return_weights`, and on the CPU by
    default, where its backward pass is faster. Otherwise `jax.nn.dot_product_attention` runs:
    `implementation="xla"` forces it on any device, `"cudnn"` asks for the cuDNN flash kernel
    on an NVIDIA GPU. Both paths give zero output for fully masked queries.
    """
    dropout_active = (
        dropout is not None
        and dropout_key is not None
        and not dropout.inference
        and dropout.rate > 0.0
    )
    explicit_by_default = implementation is None and jax.default_backend() == "cpu"
    if return_weights or dropout_active or explicit_by_default:
        weights = attention_weights(query, key, mask)
        if dropout is not None:
            weights = dropout(weights, key=dropout_key)
        output = jnp.einsum("hqk,khd->qhd", weights.astype(value.dtype), value)
        return output, (weights if return_weights else None)

    # jax's own kernel mixes bf16 and f32 internally, which strict promotion would reject.
    with jax.numpy_dtype_promotion("standard"):
        output = jax.nn.dot_product_attention(
            query,
            key,
            value,
            mask=None if mask is None else mask[None, :, :],
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
    """Keys and values of one self-attention layer, preallocated to `max_len` positions."""

    keys: Float[Array, "*layers max_len heads head_dim"]
    values: Float[Array, "*layers max_len heads head_dim"]

    @staticmethod
    def empty(max_len: int, num_heads: int, head_dim: int, dtype=jnp.float32) -> KVCache:
        shape = (max_len, num_heads, head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def write(
        self,
        new_keys: Float[Array, "seq heads head_dim"],
        new_values: Float[Array, "seq heads head_dim"],
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
    """

    query_proj: Linear
    key_proj: Linear
    value_proj: Linear
    output_proj: Linear
    dropout: Dropout
    num_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    implementation: str | None = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        kv_dim: int | None = None,
        use_bias: bool = True,
        dropout_rate: float = 0.0,
        implementation: str | None = None,
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
        kv_dim = d_model if kv_dim is None else kv_dim
        inner = num_heads * head_dim
        q_key, k_key, v_key, o_key = jax.random.split(key, 4)
        common = dict(use_bias=use_bias, init_std=init_std, dtype=dtype)
        self.query_proj = Linear(d_model, inner, key=q_key, **common)
        self.key_proj = Linear(kv_dim, inner, key=k_key, **common)
        self.value_proj = Linear(kv_dim, inner, key=v_key, **common)
        self.output_proj = Linear(inner, d_model, key=o_key, **common)
        self.dropout = Dropout(dropout_rate)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.implementation = implementation

    def _split_heads(self, x: Float[Array, "seq inner"]) -> Float[Array, "seq heads head_dim"]:
        return x.reshape(x.shape[0], self.num_heads, self.head_dim)

    def project_query(self, x: Float[Array, "seq d_model"]) -> Float[Array, "seq heads head_dim"]:
        return self._split_heads(self.query_proj(x))

    def project_key_value(
        self, context: Float[Array, "kv_seq d_kv"]
    ) -> tuple[Float[Array, "kv_seq heads head_dim"], Float[Array, "kv_seq heads head_dim"]]:
        """Keys and values of `context`: computed once per source for cross-attention."""
        return self._split_heads(self.key_proj(context)), self._split_heads(
            self.value_proj(context)
        )

    def attend(
        self,
        query: Float[Array, "seq heads head_dim"],
        keys: Float[Array, "kv_seq heads head_dim"],
        values: Float[Array, "kv_seq heads head_dim"],
        mask: Bool[Array, "seq kv_seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], Float[Array, "heads seq kv_seq"] | None]:
        """Attend projected queries to projected keys/values and apply the output projection."""
        heads, weights = dot_product_attention(
            query,
            keys,
            values,
            mask,
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
        mask: Bool[Array, "seq kv_seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq d_model"]:
        """Self-attention over `x`, or cross-attention from `x` to `context`."""
        keys, values = self.project_key_value(x if context is None else context)
        output, _ = self.attend(self.project_query(x), keys, values, mask, key=key)
        return output
