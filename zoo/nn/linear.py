"""Affine layer on the last axis, with weights laid out as `[out, in]` (as in PyTorch), and the
`Init` record every part that initialises weights takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.records import legacy_keywords


@dataclass(frozen=True)
class Init:
    """How a part initialises its weights: normal with standard deviation `std`, in `dtype`.

    A config's is `config.init` (`init_std` and `dtype`); every part that makes weights
    (`Linear`, `Embedder`, `MultiHeadAttention`, `FeedForward`, `TransformerBlock`,
    `MaskedLMHead`, `RelativePositionBias`) takes one.
    """

    std: float = 0.02
    dtype: Any = jnp.float32

    def normal(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Array:
        """A weight of `shape` drawn this way."""
        return (self.std * jax.random.normal(key, shape)).astype(self.dtype)

    def linear(
        self, in_features: int, out_features: int, use_bias: bool = True, *, key: PRNGKeyArray
    ) -> Linear:
        """A `Linear` initialised this way."""
        return Linear(in_features, out_features, use_bias=use_bias, init=self, key=key)


def legacy_init(function: str, init: Init | None, legacy: dict[str, Any]) -> Init:
    """`init`, or the `Init` of a call's older loose `init_std=` / `dtype=` keywords (with a
    DeprecationWarning naming `init=Init(...)`); the default `Init()` when neither is given."""
    old = legacy_keywords(function, legacy, ("init_std", "dtype"), "init=Init(std, dtype)")
    init = Init() if init is None else init
    if "init_std" in old:
        init = Init(old["init_std"], init.dtype)
    if "dtype" in old:
        init = Init(init.std, old["dtype"])
    return init


class Linear(eqx.Module):
    """`y = x W^T + b` on the last axis of `x` (any leading axes, e.g. `seq`).

    The weight is drawn as `init` says (default `Init()`: std 0.02, float32); the bias starts
    at zero. The older `init_std=` and `dtype=` keywords still work, with a DeprecationWarning.
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
        **legacy: Any,
    ):
        init = legacy_init("Linear", init, legacy)
        self.weight = init.normal(key, (out_features, in_features))
        self.bias = jnp.zeros((out_features,), init.dtype) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (-1,))
        return y
