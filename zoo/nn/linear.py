"""Affine layer on the last axis, with weights laid out as `[out, in]` (as in PyTorch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray


class Linear(eqx.Module):
    """`y = x W^T + b` on the last axis of `x` (any leading axes, e.g. `seq`)."""

    weight: Float[Array, "out_features in_features"]
    bias: Float[Array, " out_features"] | None
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        self.weight = (init_std * jax.random.normal(key, (out_features, in_features))).astype(dtype)
        self.bias = jnp.zeros((out_features,), dtype) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (-1,))
        return y


@dataclass(frozen=True)
class Init:
    """How a part initialises its weights: normal with standard deviation `std`, in `dtype`."""

    std: float = 0.02
    dtype: Any = jnp.float32

    def linear(
        self, in_features: int, out_features: int, use_bias: bool = True, *, key: PRNGKeyArray
    ) -> Linear:
        """A `Linear` initialised this way."""
        return Linear(
            in_features,
            out_features,
            use_bias=use_bias,
            init_std=self.std,
            dtype=self.dtype,
            key=key,
        )
