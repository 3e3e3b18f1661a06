"""The one attention of zoo: the scores and their softmax, `dot_product_attention`, and
`MultiHeadAttention`, the module every model (classifier, GPT, translator) attends through.

Everything works on one example: sequences are `Float[Array, "seq d_model"]`; batch with
`jax.vmap`. Read top to bottom: `attention_weights` (the one score einsum and softmax of zoo),
`dot_product_attention` (which kernel runs a call). `MultiHeadAttention` (projections, QK-norm,
rotary, heads) and its `AttentionSettings` are in `multihead.py`. What a query may see is a
`zoo.nn.Mask` (`mask.py`); the fused kernels and the choice among them are in `kernel.py`; the
KV cache of decoding is in `cache.py` (`KVCache`, also importable from here).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from zoo.nn.cache import KVCache
from zoo.nn.kernel import KernelOptions, choose_kernel, fused_attention
from zoo.nn.mask import Mask, as_mask

__all__ = [
    "KVCache",
    "KernelOptions",
    "as_mask",
    "attention_weights",
    "dot_product_attention",
]

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
    scale: bool | float = True,
    softcap: float | None = None,
) -> Float[Array, "heads seq kv_seq"]:
    """softmax(q k^T / sqrt(head_dim) + score_bias) per head, in float32.

    `score_bias` is added to the scaled scores (T5's relative positions); `scale=False` leaves
    out the 1/sqrt(head_dim) (T5 folds it into its initialisation), a number is the factor
    itself (Gemma's `query_pre_attn_scalar ** -0.5`). `softcap` squashes the scaled scores
    into `(-softcap, softcap)` by `softcap * tanh(scores / softcap)` (Gemma 2). With grouped-query
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
    if scale is True:
        scores = scores * (1.0 / math.sqrt(query.shape[-1]))
    elif scale is not False:
        scores = scores * np.float32(scale)
    if softcap is not None:
        scores = jnp.tanh(scores / np.float32(softcap)) * np.float32(softcap)
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


def dot_product_attention(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq kv_heads head_dim"],
    value: Float[Array, "kv_seq kv_heads head_dim"],
    mask: Mask | Bool[Array, "seq kv_seq"] | None = None,
    *,
    score_bias: Float[Array, "heads seq kv_seq"] | None = None,
    return_weights: bool = False,
    options: KernelOptions | None = None,
) -> tuple[Float[Array, "seq heads head_dim"], Float[Array, "heads seq kv_seq"] | None]:
    """Scaled dot-product attention for one example; returns (output, weights or None).

    `zoo.nn.kernel.choose_kernel` picks the kernel from `options.implementation` (None: by
    platform; "explicit", "xla", "cudnn"): zoo's explicit float32 softmax (attention dropout,
    `return_weights`, the CPU by default) or `jax.nn.dot_product_attention`, which gets the
    mask as its own arguments (`is_causal`, sequence lengths, `local_window_size`) where the
    mask can be said that way, so cuDNN runs its causal and padding kernels without reading a
    `[seq, kv_seq]` array (`zoo.nn.kernel.fused_attention`). Every kernel gives the same
    result: zero output for queries that see no key, grouped-query attention (fewer key/value
    heads), `score_bias` added to the scaled scores and `options.scale` honoured (see
    `attention_weights`).

    Args:
        query: one example's queries, `[seq, heads, head_dim]`.
        key: its keys, `[kv_seq, kv_heads, head_dim]` (`kv_heads` divides `heads`).
        value: its values, shaped as the keys.
        mask: a `zoo.nn.Mask` (causal order, lengths, window, cache offset, segments), a
            boolean `[seq, kv_seq]` array (True = may attend), or None (every key).
        score_bias: `[heads, seq, kv_seq]` added to the scaled scores (T5's relative
            positions), or None.
        return_weights: also return the attention weights (runs the explicit kernel).
        options: the kernel asked for, score scaling, attention dropout and its key
            (`zoo.nn.kernel.KernelOptions`); None: the defaults.
    """
    options = KernelOptions() if options is None else options
    mask = as_mask(mask)
    num_queries, num_keys = query.shape[0], key.shape[0]
    arguments = mask.kernel_arguments(num_queries, num_keys)
    kernel = choose_kernel(
        options.implementation,
        query=query,
        key=key,
        mask_arguments=arguments,
        return_weights=return_weights,
        dropout_active=options.dropout_active,
        softcap=options.softcap is not None,
    )
    if kernel == "explicit":
        weights = attention_weights(
            query,
            key,
            mask.array(num_queries, num_keys),
            score_bias=score_bias,
            scale=options.scale,
            softcap=options.softcap,
        )
        if options.dropout is not None:
            weights = options.dropout(weights, key=options.dropout_key)
        output = _weighted_values(weights.astype(value.dtype), value)
        return output, (weights if return_weights else None)
    output = fused_attention(
        query,
        key,
        value,
        mask,
        arguments=arguments,
        score_bias=score_bias,
        scale=options.scale,
        kernel=kernel,
    )
    return output, None
