"""The one attention of zoo: the scores and their softmax, `dot_product_attention`, and
`MultiHeadAttention`, the module every model (classifier, GPT, translator) attends through.

Everything works on one example: sequences are `Float[Array, "seq d_model"]`; batch with
`jax.vmap`. Read top to bottom: `attention_weights` (the one score einsum and softmax of zoo),
`dot_product_attention` (which kernel runs a call), then `AttentionSettings` and
`MultiHeadAttention` (projections, QK-norm, rotary, heads). What a query may see is a
`zoo.nn.Mask` (`mask.py`); the fused kernels and the choice among them are in `kernel.py`; the
KV cache of decoding is in `cache.py` (`KVCache`, also importable from here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.nn.cache import KVCache
from zoo.nn.dropout import Dropout
from zoo.nn.kernel import IMPLEMENTATIONS, KernelOptions, choose_kernel, fused_attention
from zoo.nn.linear import Init, Linear
from zoo.nn.mask import Mask, as_mask
from zoo.nn.norm import RMSNorm
from zoo.nn.rotary import Rope, RotaryEmbedding, RotaryTable
from zoo.records import legacy_keywords

QK_NORM_SCOPES = ("head", "projection")

__all__ = [
    "AttentionSettings",
    "KVCache",
    "KernelOptions",
    "MultiHeadAttention",
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
    **legacy: Any,
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
        **legacy: the older loose keywords `scale`, `dropout`, `dropout_key` and
            `implementation`, still accepted with a DeprecationWarning.
    """
    options = KernelOptions() if options is None else options
    if legacy:
        old = legacy_keywords(
            "dot_product_attention", legacy, KernelOptions._fields, "options=KernelOptions(...)"
        )
        options = options._replace(**old)
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


# --------------------------------------------------------------------------------------------
# multi-head attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttentionSettings:
    """What a `MultiHeadAttention` is, besides its width and initialisation.

    A model's config resolves it (`config.attention_settings()`); the fields carry the config's
    names and meanings. `num_kv_heads < num_heads` is grouped-query attention (1: multi-query);
    `attention_head_dim` None is `d_model // num_heads` (`width`); biases per projection
    (`qkv_bias`, `attention_output_bias`); `qk_norm` is an RMSNorm over each head of the
    queries and keys (Qwen3); `rope` rotates queries and keys by their positions (Llama);
    `scale_scores=False` leaves out the 1/sqrt(head_dim) (T5, whose relative positions come in
    as a score bias); `attention_implementation` picks the kernel (`zoo.nn.kernel`: None by
    platform, "explicit", "xla", "cudnn"). Gemma's parts: `query_pre_attn_scalar` scales the
    scores by its inverse square root instead of head_dim's, `attention_softcap` soft-caps them
    (Gemma 2), and `norm_weight_offset=1` makes the QK-norms multiply by `1 + weight`
    (Gemma 3). `qk_norm_scope="projection"` normalises the whole query and key projections
    (all heads together, OLMo 2) instead of each head.
    """

    num_heads: int  # query heads
    num_kv_heads: int | None = None  # key/value heads (must divide num_heads); None: num_heads
    attention_head_dim: int | None = None  # per-head width; None: d_model // num_heads
    qkv_bias: bool = True  # biases on the query, key and value projections
    attention_output_bias: bool = True  # bias on the output projection
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (before rotary)
    layer_norm_eps: float = 1e-6  # epsilon of the QK-norm
    attention_dropout: float = 0.0  # dropout on the attention weights
    attention_implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    scale_scores: bool = True  # divide scores by sqrt(head_dim)
    rope: Rope | None = None  # rotary positions; None: positions come in elsewhere
    qk_norm_scope: str = "head"  # head: each head (Qwen3, Gemma 3) | projection: all (OLMo 2)
    norm_weight_offset: float = 0.0  # QK-norms scale by offset + weight (Gemma 3: 1)
    query_pre_attn_scalar: float | None = None  # scores times this ** -0.5 (Gemma); None: head_dim
    attention_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)

    def __post_init__(self) -> None:
        if not isinstance(self.num_heads, int) or self.num_heads <= 0:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads!r}")
        for name in ("num_kv_heads", "attention_head_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.num_heads % self.kv_heads != 0:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}: each "
                "key/value head serves the same number of query heads; 1 is multi-query attention"
            )
        if self.qk_norm_scope not in QK_NORM_SCOPES:
            raise ValueError(
                f"qk_norm_scope must be one of {QK_NORM_SCOPES}, got {self.qk_norm_scope!r}"
            )
        for name in ("query_pre_attn_scalar", "attention_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if self.query_pre_attn_scalar is not None and not self.scale_scores:
            raise ValueError(
                "query_pre_attn_scalar sets how scores are scaled, but scale_scores=False "
                "leaves them unscaled: set one of the two"
            )
        if self.attention_implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention_implementation must be one of {IMPLEMENTATIONS} (None picks by "
                f"platform), got {self.attention_implementation!r}"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, else one per query head."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def score_scale(self) -> bool | float:
        """`KernelOptions.scale`: True (1/sqrt(head_dim)), False (none) or the factor."""
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar) ** -0.5
        return self.scale_scores

    def width(self, d_model: int) -> int:
        """The per-head width (`head_dim`) for a model of width `d_model`:
        `attention_head_dim`, else d_model // num_heads."""
        if self.attention_head_dim is not None:
            return self.attention_head_dim
        if d_model % self.num_heads != 0:
            divisors = [d for d in range(1, min(d_model, 64) + 1) if d_model % d == 0]
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}; pick "
                f"num_heads from the divisors of d_model, e.g. {divisors}, or set "
                "attention_head_dim"
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
    scale_scores: bool | float = eqx.field(static=True)
    softcap: float | None = eqx.field(static=True)
    qk_norm_scope: str = eqx.field(static=True)

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
        output_bias, eps = s.attention_output_bias, s.layer_norm_eps
        self.output_proj = init.linear(s.num_heads * head_dim, d_model, output_bias, key=o_key)
        whole = s.qk_norm_scope == "projection"
        query_width = s.num_heads * head_dim if whole else head_dim
        key_width = s.kv_heads * head_dim if whole else head_dim
        offset = s.norm_weight_offset
        self.query_norm, self.key_norm = None, None
        if s.qk_norm:
            self.query_norm = RMSNorm(query_width, eps=eps, dtype=init.dtype, offset=offset)
            self.key_norm = RMSNorm(key_width, eps=eps, dtype=init.dtype, offset=offset)
        self.rotary = None if s.rope is None else RotaryEmbedding(head_dim, s.rope)
        self.dropout = Dropout(s.attention_dropout)
        self.num_heads = s.num_heads
        self.num_kv_heads = s.kv_heads
        self.head_dim = head_dim
        self.implementation = s.attention_implementation
        self.scale_scores = s.score_scale
        self.softcap = s.attention_softcap
        self.qk_norm_scope = s.qk_norm_scope

    def _whole(self, projected: Array, norm: RMSNorm | None) -> Array:
        """The QK-norm over the whole projection (OLMo 2), before the heads are split."""
        if norm is not None and self.qk_norm_scope == "projection":
            return norm(projected)
        return projected

    def _split_heads(self, x: Float[Array, "seq inner"], heads: int) -> Array:
        return x.reshape(x.shape[0], heads, self.head_dim)

    def _position(self, x: Array, norm: RMSNorm | None, rotary_table: RotaryTable | None) -> Array:
        """QK-norm (per head), then the rotary rotation by the table of the positions."""
        if norm is not None and self.qk_norm_scope == "head":
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
        query = self._whole(self.query_proj(x), self.query_norm)
        query = self._split_heads(query, self.num_heads)
        return self._position(query, self.query_norm, rotary_table)

    def project_key_value(
        self, context: Float[Array, "kv_seq d_kv"], rotary_table: RotaryTable | None = None
    ) -> tuple[Float[Array, "kv_seq kv_heads head_dim"], Float[Array, "kv_seq kv_heads head_dim"]]:
        """Keys and values of `context`: computed once per source for cross-attention. With
        rotary the keys are rotated like the queries."""
        keys = self._split_heads(
            self._whole(self.key_proj(context), self.key_norm), self.num_kv_heads
        )
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

        Args:
            query: `project_query`'s queries, `[seq, heads, head_dim]`.
            keys: `project_key_value`'s keys (or a cache's), `[kv_seq, kv_heads, head_dim]`.
            values: the values beside them.
            mask: a `zoo.nn.Mask` or a boolean `[seq, kv_seq]` array (see
                `dot_product_attention`); None: every key.
            score_bias: added to every head's scores (relative positions,
                `zoo.nn.relative_position`), or None.
            key: the attention dropout's key; None: no dropout.
            return_weights: also return the attention weights `[heads, seq, kv_seq]`.
        """
        options = KernelOptions(
            implementation=self.implementation,
            scale=self.scale_scores,
            softcap=self.softcap,
            dropout=self.dropout,
            dropout_key=key,
        )
        heads, weights = dot_product_attention(
            query,
            keys,
            values,
            mask,
            score_bias=score_bias,
            return_weights=return_weights,
            options=options,
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
