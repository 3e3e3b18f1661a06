"""`MultiHeadAttention`, the module every model attends through, and its settings.

Projections to queries, keys and values, the QK-norm, rotary positions, the heads, and the
output projection; the attention itself is `zoo.nn.attention.dot_product_attention` (the one
softmax of zoo). What tells today's families apart is the module's `AttentionSettings`.
Everything works on one example (`Float[Array, "seq d_model"]`); batch with `jax.vmap`.
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.nn.attention import dot_product_attention
from zoo.nn.dropout import Dropout
from zoo.nn.kernel import IMPLEMENTATIONS, KernelOptions
from zoo.nn.linear import Init, Linear
from zoo.nn.mask import Mask, as_mask
from zoo.nn.norm import RMSNorm
from zoo.nn.rotary import Rope, RotaryEmbedding, RotaryTable
from zoo.tree import with_fields

QK_NORM_SCOPES = ("head", "projection")


@dataclass(frozen=True, kw_only=True)
class QKNorm:
    """An RMSNorm on the queries and keys before the rotation (Qwen3, Gemma 3, OLMo 2)."""

    scope: str = "head"  # head: each head (Qwen3, Gemma 3) | projection: all heads (OLMo 2)
    eps: float = 1e-6  # the RMSNorm's epsilon
    weight_offset: float = 0.0  # scale by offset + weight (Gemma 3: 1.0)

    def __post_init__(self) -> None:
        if self.scope not in QK_NORM_SCOPES:
            raise ValueError(f"qk_norm scope must be one of {QK_NORM_SCOPES}, got {self.scope!r}")
        if not self.eps > 0:
            raise ValueError(f"qk_norm eps must be positive, got {self.eps}")


@dataclass(frozen=True, kw_only=True)
class AttentionSettings:
    """What a `MultiHeadAttention` is, besides its width and initialisation.

    `num_kv_heads < num_heads` is grouped-query attention (1: multi-query); `head_dim` None is
    `d_model // num_heads` (`width`). `rope` rotates queries and keys by their positions
    (Llama); `window` lets a query see only the last `window` keys (causal) or the keys less
    than `window` positions away (an encoder's two-sided window, ModernBERT); `scale_dim` sets
    the score scale `1/sqrt(scale_dim)` (Gemma's `query_pre_attn_scalar`; T5: 1, unscaled);
    `softcap` squashes the scores into `(-softcap, softcap)` (Gemma 2). `implementation` picks
    the kernel (`zoo.nn.kernel`: None by platform, "explicit", "xla", "cudnn").
    """

    num_heads: int = 8  # query heads
    num_kv_heads: int | None = None  # key/value heads (must divide num_heads); None: num_heads
    head_dim: int | None = None  # per-head width; None: d_model // num_heads (Qwen3: 128)
    qkv_bias: bool = True  # biases on the query, key and value projections
    output_bias: bool = True  # bias on the output projection
    qk_norm: QKNorm | None = None  # an RMSNorm on queries and keys; None: none
    dropout: float = 0.0  # dropout on the attention weights
    implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    scale_dim: float | None = None  # scores / sqrt(scale_dim); None: head_dim (T5: 1.0)
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2)
    rope: Rope | None = None  # rotary positions; None: positions come in elsewhere (or none)
    window: int | None = None  # each query sees the last `window` keys (Mistral); None: all

    def __post_init__(self) -> None:
        if not isinstance(self.num_heads, int) or self.num_heads <= 0:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads!r}")
        for name in ("num_kv_heads", "head_dim", "window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.num_heads % self.kv_heads != 0:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}: each "
                "key/value head serves the same number of query heads; 1 is multi-query attention"
            )
        for name in ("scale_dim", "softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {self.dropout}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention implementation must be one of {IMPLEMENTATIONS} (None picks by "
                f"platform), got {self.implementation!r}"
            )
        if self.rope is not None and self.head_dim is not None:
            self.rope.rotary_dim(self.head_dim)  # an odd number of rotating dimensions fails now

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, else one per query head."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def score_scale(self) -> bool | float:
        """`KernelOptions.scale`: True (1/sqrt(head_dim)) or the factor 1/sqrt(scale_dim)."""
        if self.scale_dim is None:
            return True
        return float(self.scale_dim) ** -0.5

    def width(self, d_model: int) -> int:
        """The per-head width for a model of width `d_model`: `head_dim`, else
        d_model // num_heads."""
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.num_heads != 0:
            divisors = [d for d in range(1, min(d_model, 64) + 1) if d_model % d == 0]
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}; pick "
                f"num_heads from the divisors of d_model, e.g. {divisors}, or set head_dim"
            )
        return d_model // self.num_heads


class MultiHeadAttention(eqx.Module):
    """Multi-head attention for one example (self- or cross-attention).

    Batch with `jax.vmap`. Query, key, value and output projections are separate `Linear`s so
    that self- and cross-attention share one code path and pretrained weights map one-to-one.
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
    window: int | None = eqx.field(static=True, default=None)

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
        self.query_norm, self.key_norm = None, None
        qk = s.qk_norm
        if qk is not None:
            whole = qk.scope == "projection"
            query_width = s.num_heads * head_dim if whole else head_dim
            key_width = s.kv_heads * head_dim if whole else head_dim
            eps, offset = qk.eps, qk.weight_offset
            self.query_norm = RMSNorm(query_width, eps=eps, dtype=init.dtype, offset=offset)
            self.key_norm = RMSNorm(key_width, eps=eps, dtype=init.dtype, offset=offset)
        self.rotary = None if s.rope is None else RotaryEmbedding(head_dim, s.rope)
        self.dropout = Dropout(s.dropout)
        self.num_heads = s.num_heads
        self.num_kv_heads = s.kv_heads
        self.head_dim = head_dim
        self.implementation = s.implementation
        self.scale_scores = s.score_scale
        self.softcap = s.softcap
        self.qk_norm_scope = "head" if qk is None else qk.scope
        self.window = s.window

    def with_call(self, *, window: int | None, rope: Rope | None) -> MultiHeadAttention:
        """The same weights called with another window and rotary base (a layer of a stack
        whose layers share their weights' shapes but differ in these: Gemma's local and global
        layers, SmolLM3's layers without rotary positions)."""
        current = None if self.rotary is None else self.rotary.rope
        if window == self.window and rope == current:
            return self
        rotary = None if rope is None else RotaryEmbedding(self.head_dim, rope)
        return with_fields(self, window=window, rotary=rotary)

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

        The attention's own `window` narrows the `mask` (the narrower of the two wins).

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
            self._windowed(mask),
            score_bias=score_bias,
            return_weights=return_weights,
            options=options,
        )
        merged = heads.reshape(heads.shape[0], self.num_heads * self.head_dim)
        return self.output_proj(merged), weights

    def _windowed(self, mask: Mask | Bool[Array, "seq kv_seq"] | None) -> Mask:
        """`mask` narrowed by this attention's window."""
        mask = as_mask(mask)
        if self.window is None or (mask.window is not None and mask.window <= self.window):
            return mask
        return mask.replace(window=self.window)

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
