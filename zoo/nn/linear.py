"""Affine layer on the last axis, with weights laid out as `[out, in]` (as in PyTorch), and the
`Init` record every part that initialises weights takes."""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray


@dataclass(frozen=True)
class Init:
    """How a part initialises its weights: normal with standard deviation `std`, in `dtype`.

    A config's is `config.init` (its `init_std` and `dtype`); every part that makes weights
    (`Linear`, `Embedder`, `MultiHeadAttention`, `FeedForward`, `TransformerBlock`,
    `MaskedLMHead`, `RelativePositionBias`) takes one.
    """

    std: float = 0.02
    dtype: jnp.dtype | type = jnp.float32  # a dtype or a scalar type (jnp.bfloat16)

    def normal(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Array:
        """A weight of `shape` drawn this way."""
        return (self.std * jax.random.normal(key, shape)).astype(self.dtype)

    def linear(
        self, in_features: int, out_features: int, use_bias: bool = True, *, key: PRNGKeyArray
    ) -> Linear:
        """A `Linear` initialised this way."""
        return Linear(in_features, out_features, use_bias=use_bias, init=self, key=key)


class Linear(eqx.Module):
    """`y = x W^T + b` on the last axis of `x` (any leading axes, e.g. `seq`).

    The weight is drawn as `init` says (default `Init()`: std 0.02, float32); the bias starts
    at zero.
    """

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
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        init = Init() if init is None else init
        self.weight = init.normal(key, (out_features, in_features))
        self.bias = jnp.zeros((out_features,), init.dtype) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (-1,))
        return y
