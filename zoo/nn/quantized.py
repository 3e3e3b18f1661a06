"""`QuantizedLinear`: a frozen `Linear` stored in int8, and where a model holds them.

Each quantized layer keeps its weight as int8 with one float32 scale per output row
(`absmax / 127`, symmetric, round to nearest): a quarter of the float32 bytes plus `4 * out`.
The call multiplies the input by the int8 weight converted to the input's dtype (XLA fuses the
conversion into the matmul) and scales the output rows, which equals `x @ (q * scale)^T`: the
weight is dequantized inside the matmul, never stored in float. Integer arrays are not
parameters (`eqx.is_inexact_array`), so they get no gradient and no optimizer state.

Why not a library: `qwix` (Google's JAX quantization library) quantizes Flax (linen / nnx)
modules by intercepting their calls, and even its array type imports `flax`; AQT is its Flax
predecessor. Neither acts on Equinox modules, and per-channel int8 is a few lines.

`quantized_paths` and `quantize_at` are what `zoo.save` and `zoo.load` use to record and rebuild
the int8 layers of a model; `zoo.lora.quantize` chooses which layers to quantize.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int8

from zoo.nn.linear import Linear
from zoo.tree import KeyPath, path_name

INT8_MAX = 127
Model = TypeVar("Model", bound=eqx.Module)


class QuantizedLinear(eqx.Module):
    """`Linear` with an int8 weight and per-output-row float32 scales; same call signature."""

    weight: Int8[Array, "*layers out_features in_features"]
    scale: Float[Array, "*layers out_features"]
    bias: Float[Array, "*layers out_features"] | None
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)

    @staticmethod
    def from_linear(linear: Linear) -> QuantizedLinear:
        """Symmetric per-row int8: `scale = max|W_row| / 127`, `q = round(W / scale)`."""
        weight = linear.weight.astype(jnp.float32)
        absmax = jnp.max(jnp.abs(weight), axis=-1)
        scale = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0)
        q = jnp.clip(jnp.round(weight / scale[..., None]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
        return QuantizedLinear(q, scale, linear.bias, linear.in_features, linear.out_features)

    def dequantize(self, dtype: DTypeLike = jnp.float32) -> Linear:
        """A float `Linear` with `W = q * scale` (what this layer computes)."""
        weight = (self.weight.astype(jnp.float32) * self.scale[..., None]).astype(dtype)
        use_bias = self.bias is not None
        shell = eqx.filter_eval_shape(  # shapes only: no random init for weights replaced anyway
            Linear, self.in_features, self.out_features, use_bias=use_bias, key=jax.random.key(0)
        )
        if not use_bias:
            return eqx.tree_at(lambda linear: linear.weight, shell, weight)
        return eqx.tree_at(lambda linear: (linear.weight, linear.bias), shell, (weight, self.bias))

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = x @ self.weight.T.astype(x.dtype)
        y = y * self.scale.astype(y.dtype).reshape((1,) * (y.ndim - 1) + (-1,))
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (-1,)).astype(y.dtype)
        return y


def is_quantized(node: object) -> bool:
    return isinstance(node, QuantizedLinear)


def float_dtype(layer: Linear | QuantizedLinear) -> np.dtype:
    """The floating dtype of a layer's computation: its weight's, or its scales' when quantized."""
    return layer.scale.dtype if isinstance(layer, QuantizedLinear) else layer.weight.dtype


def float_linears(model: eqx.Module) -> dict[str, Linear]:
    """Every float `Linear` of `model` by path, including the bases inside `LoRALinear`s."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda n: isinstance(n, Linear))
    return {path_name(p): node for p, node in flat if isinstance(node, Linear)}


def quantize_at(model: Model, paths: Iterable[str]) -> Model:
    """`model` with the float `Linear`s at `paths` replaced by `QuantizedLinear`s."""
    wanted = set(paths)
    linears = float_linears(model)
    missing = sorted(wanted - set(linears))
    if missing:
        raise ValueError(
            f"no float Linear layer at {missing} to quantize; this model's are: "
            f"{', '.join(linears)}"
        )

    def swap(path: KeyPath, node: object) -> object:
        if isinstance(node, Linear) and path_name(path) in wanted:
            return QuantizedLinear.from_linear(node)
        return node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=lambda n: isinstance(n, Linear))


def quantized_paths(model: eqx.Module) -> list[str]:
    """The paths of the `QuantizedLinear`s of `model` (what `zoo.save` records to rebuild them)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_quantized)
    return [path_name(p) for p, node in flat if is_quantized(node)]


def dequantize(model: Model, dtype: DTypeLike = jnp.float32) -> Model:
    """`model` with every `QuantizedLinear` turned back into a float `Linear` (`W = q * scale`)."""
    return jax.tree_util.tree_map(
        lambda n: n.dequantize(dtype) if is_quantized(n) else n, model, is_leaf=is_quantized
    )
