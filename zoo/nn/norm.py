"""Layer normalisation over the feature axis, computed in float32 whatever the input dtype."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class LayerNorm(eqx.Module):
    """`(x - mean) / sqrt(var + eps) * weight + bias` over the last axis."""

    weight: Float[Array, " d_model"]
    bias: Float[Array, " d_model"]
    eps: float = eqx.field(static=True)

    def __init__(self, d_model: int, *, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = jnp.ones((d_model,), dtype)
        self.bias = jnp.zeros((d_model,), dtype)
        self.eps = eps

    def __call__(self, x: Float[Array, "*lead d_model"]) -> Float[Array, "*lead d_model"]:
        # Statistics in float32: bf16 variance of wide activations loses too much precision.
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        lead = (1,) * (x.ndim - 1)
        scaled = normed * self.weight.astype(jnp.float32).reshape((*lead, -1))
        return (scaled + self.bias.astype(jnp.float32).reshape((*lead, -1))).astype(x.dtype)
