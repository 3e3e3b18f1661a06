"""`LoRALinear`: a frozen `Linear` plus a trainable low-rank update `B A * alpha / rank`, and
where a model holds its `Linear`s and adapters.

`A` is `[rank, in_features]` and `B` is `[out_features, rank]`, laid out as PEFT's `lora_A` and
`lora_B` weights. Inside a scanned layer stack both carry the stack's leading `layers` axis, like
every other array of the blocks.

A layer's path is the dotted name of the module in the model, without `.weight`
(`layers.blocks.self_attention.query_proj`). `describe` and `rebuild` are what `zoo.save` and
`zoo.load` use to record and restore the adapters of a model; `zoo.lora` builds on the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypedDict, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.linear import Linear
from zoo.nn.quantized import QuantizedLinear, float_dtype
from zoo.tree import KeyPath, path_name

Model = TypeVar("Model", bound=eqx.Module)


class LoRALinear(eqx.Module):
    """`base(x) + (x A^T) B^T * alpha / rank` on the last axis of `x`.

    The base layer sits behind `jax.lax.stop_gradient`: its weights get a zero gradient (and the
    backward pass skips their weight-gradient products), so only `lora_a` and `lora_b` learn.
    """

    base: Linear | QuantizedLinear
    lora_a: Float[Array, "*layers rank in_features"]
    lora_b: Float[Array, "*layers out_features rank"]
    alpha: float = eqx.field(static=True)

    def __init__(
        self, base: Linear | QuantizedLinear, lora_a: Array, lora_b: Array, *, alpha: float | int
    ):
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.alpha = float(alpha)

    @staticmethod
    def wrap(
        base: Linear | QuantizedLinear, *, rank: int, alpha: float | int, key: PRNGKeyArray
    ) -> LoRALinear:
        """`base` with a fresh adapter: `A` uniform in `±1/sqrt(in_features)`, `B` zero.

        `B = 0` makes the wrapped layer compute exactly what `base` does. `A`'s range is PEFT's
        (`kaiming_uniform_(a=sqrt(5))`). Leading axes of `base.weight` (stacked layers) are kept.
        """
        lead = base.weight.shape[:-2]
        bound = 1.0 / math.sqrt(base.in_features)
        dtype = float_dtype(base)
        lora_a = jax.random.uniform(
            key, (*lead, rank, base.in_features), jnp.float32, -bound, bound
        ).astype(dtype)
        lora_b = jnp.zeros((*lead, base.out_features, rank), dtype)
        return LoRALinear(base, lora_a, lora_b, alpha=alpha)

    @property
    def rank(self) -> int:
        return self.lora_a.shape[-2]

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def scale(self) -> float:
        """`alpha / rank`: PEFT's `scaling` (without rsLoRA)."""
        return self.alpha / self.rank

    def delta(self) -> Float[Array, "*layers out_features in_features"]:
        """The update the adapter adds to the base weight: `scale * B @ A`, in float32."""
        product = jnp.einsum(
            "...or,...ri->...oi", self.lora_b.astype(jnp.float32), self.lora_a.astype(jnp.float32)
        )
        return product * self.scale

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = jax.lax.stop_gradient(self.base)(x)
        update = (x @ self.lora_a.T) @ self.lora_b.T
        return y + (update * self.scale).astype(y.dtype)


class AdapterShape(TypedDict):
    """What `zoo.save` records of one adapter (in `config.json`'s `"lora"`)."""

    rank: int
    alpha: float


def is_linear(node: object) -> bool:
    """A plain `Linear` or an int8 `QuantizedLinear` (both take adapters)."""
    return isinstance(node, Linear | QuantizedLinear)


def is_lora(node: object) -> bool:
    return isinstance(node, LoRALinear)


def plain_linears(model: eqx.Module) -> dict[str, Linear | QuantizedLinear]:
    """Every `Linear` of `model` keyed by its path, in pytree order (not those in a LoRALinear)."""

    def stop(node: object) -> bool:
        return isinstance(node, Linear | QuantizedLinear | LoRALinear)

    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=stop)
    return {path_name(path): node for path, node in flat if is_linear(node)}


def linear_paths(model: eqx.Module) -> list[str]:
    """The paths of every plain `Linear` in `model`, in pytree order."""
    return list(plain_linears(model))


def lora_layers(model: eqx.Module) -> dict[str, LoRALinear]:
    """Every `LoRALinear` of `model` keyed by its path (e.g. `layers.blocks.self_attention.query_proj`)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_lora)
    return {path_name(path): node for path, node in flat if is_lora(node)}


def has_lora(model: eqx.Module) -> bool:
    return bool(lora_layers(model))


def replace_at(
    model: Model, replace: Mapping[str, eqx.Module], is_leaf: Callable[[object], bool]
) -> Model:
    """`model` with the nodes at the given paths (found with `is_leaf`) replaced."""

    def swap(path: KeyPath, node: object) -> object:
        return replace.get(path_name(path), node) if is_leaf(node) else node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=is_leaf)


def describe(model: eqx.Module) -> dict[str, AdapterShape]:
    """Rank and alpha of every adapter, by Linear path: what `rebuild` needs to restore them."""
    return {
        path: {"rank": layer.rank, "alpha": layer.alpha}
        for path, layer in lora_layers(model).items()
    }


def rebuild(model: Model, layout: Mapping[str, AdapterShape]) -> Model:
    """`model` with adapters of the ranks in `layout` (from `describe`) at the same paths.

    The adapter values are placeholders (to be filled from a file): `A` is zero like `B`.
    """
    linears = plain_linears(model)
    missing = sorted(set(layout) - set(linears))
    if missing:
        raise ValueError(
            f"the saved adapters sit on Linear layers this model lacks: {missing}; "
            f"its Linear layers are {', '.join(linears)}"
        )
    wrapped = {}
    for path, entry in layout.items():
        linear = linears[path]
        lead = linear.weight.shape[:-2]
        dtype = float_dtype(linear)
        rank = int(entry["rank"])
        lora_a = jnp.zeros((*lead, rank, linear.in_features), dtype)
        lora_b = jnp.zeros((*lead, linear.out_features, rank), dtype)
        wrapped[path] = LoRALinear(linear, lora_a, lora_b, alpha=float(entry["alpha"]))
    return replace_at(model, wrapped, is_linear)
