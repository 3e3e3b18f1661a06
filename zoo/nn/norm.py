"""Normalisation over the feature axis, computed in float32 whatever the input dtype.

Two kinds, chosen by a `NormSettings` record's `kind`: `LayerNorm` (GPT-2, BERT, the paper) centres and
scales; `RMSNorm` (Llama, Mistral, Qwen, T5) only scales by the root mean square and has no bias.

Gemma's RMSNorm multiplies by `1 + weight`: its checkpoints store the scale minus one (zero at
initialisation). zoo's `RMSNorm(offset=1.0)` keeps the stored value as its `weight` and adds
the offset in float32 inside the call, so loading and saving copy the weight unchanged (adding
the 1 to a bf16 weight before storing it would round away its low bits).
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

NORM_KINDS = ("layernorm", "rmsnorm")


def _row(vector: Array, ndim: int) -> Array:
    """`vector` as float32, shaped to broadcast over `ndim - 1` leading axes (no rank promotion)."""
    return vector.astype(jnp.float32).reshape((*(1,) * (ndim - 1), -1))


class LayerNorm(eqx.Module):
    """`(x - mean) / sqrt(var + eps) * weight + bias` over the last axis; with `bias=False` no
    bias (ModernBERT's `norm_bias=False`)."""

    weight: Float[Array, " d_model"]
    bias: Float[Array, " d_model"] | None
    eps: float = eqx.field(static=True)

    def __init__(self, d_model: int, *, eps: float = 1e-5, dtype=jnp.float32, bias: bool = True):
        self.weight = jnp.ones((d_model,), dtype)
        self.bias = jnp.zeros((d_model,), dtype) if bias else None
        self.eps = eps

    def __call__(self, x: Float[Array, "*lead d_model"]) -> Float[Array, "*lead d_model"]:
        # Statistics in float32: bf16 variance of wide activations loses too much precision.
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        scaled = normed * _row(self.weight, x.ndim)
        if self.bias is None:
            return scaled.astype(x.dtype)
        return (scaled + _row(self.bias, x.ndim)).astype(x.dtype)


class RMSNorm(eqx.Module):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last axis (no centring, no bias).

    The statistics and the multiplication by `weight` run in float32 even for bf16 inputs and
    weights; only the result is cast back to the input dtype. Works on any leading axes, so it
    also normalises each attention head (`[seq, heads, head_dim]`, Qwen3's QK-norm). With
    `offset` (Gemma: 1.0) the scale is `offset + weight`, and the weight starts at `1 - offset`.
    """

    weight: Float[Array, " dim"]
    eps: float = eqx.field(static=True)
    offset: float = eqx.field(static=True, default=0.0)

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32, offset: float = 0.0):
        self.weight = jnp.full((dim,), 1.0 - offset, dtype)
        self.eps = eps
        self.offset = offset

    def __call__(self, x: Float[Array, "*lead dim"]) -> Float[Array, "*lead dim"]:
        x32 = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        normed = x32 * jax.lax.rsqrt(mean_square + self.eps)
        scale = _row(self.weight, x.ndim)
        if self.offset:
            scale = scale + jnp.float32(self.offset)
        return (normed * scale).astype(x.dtype)


Norm = LayerNorm | RMSNorm


@dataclass(frozen=True, kw_only=True)
class NormSettings:
    """The settings of a model's norms: which kind, its epsilon, Gemma's weight offset, and
    whether a LayerNorm has a bias."""

    kind: str = "layernorm"  # layernorm | rmsnorm (Llama, Mistral, Qwen, T5)
    eps: float = 1e-5  # added to the variance (BERT: 1e-12, Llama: 1e-5 or 1e-6)
    weight_offset: float = 0.0  # an RMSNorm scales by offset + weight (Gemma: 1.0)
    bias: bool = True  # a LayerNorm's bias (ModernBERT: none; an RMSNorm has none)

    def __post_init__(self) -> None:
        if self.kind not in NORM_KINDS:
            raise ValueError(f"norm kind must be one of {NORM_KINDS}, got {self.kind!r}")
        if not self.eps > 0:
            raise ValueError(f"norm eps must be positive, got {self.eps}")
        if self.weight_offset and self.kind != "rmsnorm":
            raise ValueError(
                f"weight_offset={self.weight_offset} is for an RMSNorm (Gemma); a LayerNorm has "
                "none: set kind='rmsnorm' or weight_offset=0"
            )

    def make(self, dim: int, dtype=jnp.float32) -> Norm:
        """A norm of width `dim` with these settings, its weights in `dtype`."""
        return make_norm(
            self.kind, dim, eps=self.eps, dtype=dtype, offset=self.weight_offset, bias=self.bias
        )


def make_norm(
    kind: str,
    dim: int,
    *,
    eps: float,
    dtype=jnp.float32,
    offset: float = 0.0,
    bias: bool = True,
) -> Norm:
    """A `LayerNorm` or an `RMSNorm` of width `dim`, by the config name `kind`; `offset` is the
    RMSNorm's (Gemma's `1 + weight`: 1.0), which a LayerNorm refuses; `bias=False` leaves the
    LayerNorm's bias out (an RMSNorm has none anyway)."""
    if kind == "layernorm":
        if offset:
            raise ValueError(
                f"norm_weight_offset={offset} is for RMSNorm (Gemma); a LayerNorm has none"
            )
        return LayerNorm(dim, eps=eps, dtype=dtype, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps, dtype=dtype, offset=offset)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORM_KINDS}")
