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

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int, Int8

from zoo.nn.linear import Linear
from zoo.nn.moe import Experts, grouped_matmul, row_experts
from zoo.nn.nf4 import NF4Linear
from zoo.tree import KeyPath, path_name

INT8_MAX = 127
PROJECTIONS = ("gate", "up", "down")  # the stacked projections of an `Experts`
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


class QuantizedExperts(eqx.Module):
    """One stacked expert projection `[experts, in, out]` in int8, with a float32 scale per
    expert and output column (`absmax / 127` over `in`): what `Experts` holds after
    `zoo.lora.quantize`. The grouped product runs `ragged_dot` on the int8 weight converted to
    the rows' dtype and scales each output row by its expert's column scales."""

    weight: Int8[Array, "*layers experts d_in d_out"]
    scale: Float[Array, "*layers experts d_out"]

    @staticmethod
    def from_float(weight: Float[Array, "*layers experts d_in d_out"]) -> QuantizedExperts:
        """Symmetric int8 per expert and output column: `q = round(W / scale)`."""
        weight32 = weight.astype(jnp.float32)
        absmax = jnp.max(jnp.abs(weight32), axis=-2)
        scale = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0)
        q = jnp.round(weight32 / scale[..., None, :])
        return QuantizedExperts(jnp.clip(q, -INT8_MAX, INT8_MAX).astype(jnp.int8), scale)

    @property
    def shape(self) -> tuple[int, ...]:
        """The float array's shape (`[*layers, experts, in, out]`)."""
        return self.weight.shape

    def dequantize(
        self, dtype: DTypeLike = jnp.float32
    ) -> Float[Array, "*layers experts d_in d_out"]:
        """`W = q * scale` as a float array."""
        return (self.weight.astype(jnp.float32) * self.scale[..., None, :]).astype(dtype)

    def grouped(
        self, rows: Float[Array, "rows d_in"], group_sizes: Int[Array, " experts"]
    ) -> Float[Array, "rows d_out"]:
        """`rows` sorted by expert through their experts' int8 projections."""
        out = grouped_matmul(rows, self.weight.astype(rows.dtype), group_sizes)
        scale = self.scale[row_experts(group_sizes, rows.shape[0])]
        return out * scale.astype(out.dtype)

    def every(self, x: Float[Array, "*lead seq d_in"]) -> Float[Array, "experts seq d_out"]:
        """Every row through every expert (the dense reference); `x` may carry `experts`."""
        spec = "esd,edf->esf" if x.ndim == 3 else "sd,edf->esf"
        out = jnp.einsum(spec, x, self.weight.astype(x.dtype))
        return out * self.scale[:, None, :].astype(out.dtype)


# How `quantize_at` stores a frozen Linear: int8 with per-row scales, or NF4 (zoo.nn.nf4)
QUANTIZED_LINEARS: dict[str, type[QuantizedLinear] | type[NF4Linear]] = {
    "int8": QuantizedLinear,
    "nf4": NF4Linear,
}


def is_quantized(node: object) -> bool:
    return isinstance(node, QuantizedLinear | NF4Linear | QuantizedExperts)


def is_quantized_linear(node: object) -> bool:
    """An int8 or NF4 frozen `Linear` (both dequantize to a `Linear`)."""
    return isinstance(node, QuantizedLinear | NF4Linear)


def as_float(layer: Linear | QuantizedLinear | NF4Linear) -> Linear:
    """A Linear layer as a float `Linear` (an int8 or NF4 one dequantized, float32)."""
    return layer if isinstance(layer, Linear) else layer.dequantize()


def weight_shape(layer: Linear | QuantizedLinear | NF4Linear) -> tuple[int, ...]:
    """A Linear layer's weight shape, `[*layers, out_features, in_features]`, however stored."""
    return (*lead_axes(layer), layer.out_features, layer.in_features)


def lead_axes(layer: Linear | QuantizedLinear | NF4Linear) -> tuple[int, ...]:
    """A Linear layer's leading (stacked `layers`) axes."""
    return layer.lead if isinstance(layer, NF4Linear) else tuple(layer.weight.shape[:-2])


def quantized_mode(model: eqx.Module) -> str:
    """ "nf4" when the model's frozen Linears are NF4, else "int8" (what `zoo.save` records)."""
    flat = jax.tree_util.tree_leaves(model, is_leaf=is_quantized)
    return "nf4" if any(isinstance(node, NF4Linear) for node in flat) else "int8"


def float_dtype(layer: Linear | QuantizedLinear | NF4Linear | QuantizedExperts | Array) -> np.dtype:
    """The floating dtype of a layer's computation: its weight's, or its scales' when quantized."""
    if isinstance(layer, QuantizedLinear | QuantizedExperts):
        return layer.scale.dtype
    if isinstance(layer, NF4Linear):
        return layer.scale_absmax.dtype
    return layer.dtype if isinstance(layer, jax.Array) else layer.weight.dtype


def float_experts(model: eqx.Module) -> dict[str, Array]:
    """Every float stacked expert projection of `model` by path (`...experts.gate`), including
    the bases inside `LoRAExperts` (`...experts.gate.base`)."""
    out: dict[str, Array] = {}
    for path, experts in expert_modules(model).items():
        for name in PROJECTIONS:
            projection = getattr(experts, name)
            base = getattr(projection, "base", None)  # a LoRAExperts' frozen base
            if eqx.is_array(projection):
                out[f"{path}.{name}"] = projection
            elif base is not None and eqx.is_array(base):
                out[f"{path}.{name}.base"] = base
    return out


def expert_modules(model: eqx.Module) -> dict[str, Experts]:
    """Every `Experts` of `model` by path (`layers.blocks.feed_forward.experts`)."""

    def is_experts(node: object) -> bool:
        return isinstance(node, Experts)

    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_experts)
    return {path_name(p): node for p, node in flat if is_experts(node)}


def replace_projections(model: Model, replace: Mapping[str, object]) -> Model:
    """`model` with the expert projections (or their LoRA bases: `...gate.base`) at the paths
    of `replace` swapped for its values."""
    if not replace:
        return model

    def swap(path: KeyPath, node: object) -> object:
        if not isinstance(node, Experts):
            return node
        prefix = path_name(path)
        for name in PROJECTIONS:
            here = f"{prefix}.{name}"
            if here in replace:
                node = eqx.tree_at(_field(name), node, replace[here])
            elif f"{here}.base" in replace:
                node = eqx.tree_at(_field(name, "base"), node, replace[f"{here}.base"])
        return node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=lambda n: isinstance(n, Experts))


def float_linears(model: eqx.Module) -> dict[str, Linear]:
    """Every float `Linear` of `model` by path, including the bases inside `LoRALinear`s."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda n: isinstance(n, Linear))
    return {path_name(p): node for p, node in flat if isinstance(node, Linear)}


def _field(*names: str) -> Callable[[eqx.Module], object]:
    """The getter of a nested field (`_field("gate", "base")`: `experts.gate.base`)."""

    def get(node: eqx.Module) -> object:
        for name in names:
            node = getattr(node, name)
        return node

    return get


def quantize_at(model: Model, paths: Iterable[str], mode: str = "int8") -> Model:
    """`model` with the float `Linear`s at `paths` replaced by `QuantizedLinear`s (`mode`
    "int8") or `NF4Linear`s ("nf4"), and the float expert projections there (`float_experts`)
    by `QuantizedExperts` (int8 only)."""
    layer_type: type[QuantizedLinear] | type[NF4Linear] = QUANTIZED_LINEARS[mode]
    wanted = set(paths)
    linears = float_linears(model)
    experts = float_experts(model)
    missing = sorted(wanted - set(linears) - set(experts))
    if missing:
        raise ValueError(
            f"no float Linear layer or expert projection at {missing} to quantize; this "
            f"model's are: {', '.join([*linears, *experts])}"
        )
    if mode != "int8" and (chosen := sorted(wanted & set(experts))):
        raise ValueError(
            f"{mode} stores Linear layers; the expert projections {chosen} are int8 only: "
            "quantize with int8, or leave the experts out"
        )
    model = replace_projections(
        model, {p: QuantizedExperts.from_float(w) for p, w in experts.items() if p in wanted}
    )

    def swap(path: KeyPath, node: object) -> object:
        if isinstance(node, Linear) and path_name(path) in wanted:
            return layer_type.from_linear(node)
        return node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=lambda n: isinstance(n, Linear))


def quantized_paths(model: eqx.Module) -> list[str]:
    """The paths of the `QuantizedLinear`s of `model` (what `zoo.save` records to rebuild them)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_quantized)
    return [path_name(p) for p, node in flat if is_quantized(node)]


def dequantize(model: Model, dtype: DTypeLike = jnp.float32) -> Model:
    """`model` with every `QuantizedLinear` and `NF4Linear` turned back into a float `Linear`
    and every `QuantizedExperts` into a float array (`W = q * scale`)."""
    return jax.tree_util.tree_map(
        lambda n: n.dequantize(dtype) if is_quantized(n) else n, model, is_leaf=is_quantized
    )
