"""`LoRALinear`: a frozen `Linear` plus a trainable low-rank update `B A * alpha / rank`, and
where a model holds its `Linear`s and adapters.

`A` is `[rank, in_features]` and `B` is `[out_features, rank]`, laid out as PEFT's `lora_A` and
`lora_B` weights. Inside a scanned layer stack both carry the stack's leading `layers` axis, like
every other array of the blocks.

LoRA dropout is PEFT's: `base(x) + B A dropout(x) * alpha / rank`, the dropout on the adapter's
input only, active only when the layer holds a key and is not in inference mode. A layer stack
gives its layers' adapters their keys (`with_dropout_keys`, from each layer's dropout key), so
a model called with a key (training) drops, and one called without (evaluation) does not.

A layer's path is the dotted name of the module in the model, without `.weight`
(`layers.blocks.self_attention.query_proj`). `describe` and `rebuild` are what `zoo.save` and
`zoo.load` use to record and restore the adapters of a model; `zoo.lora` builds on the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NotRequired, TypedDict, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Linear
from zoo.nn.moe import grouped_matmul
from zoo.nn.nf4 import NF4Linear
from zoo.nn.quantized import (
    PROJECTIONS,
    QuantizedExperts,
    QuantizedLinear,
    expert_modules,
    float_dtype,
    lead_axes,
    replace_projections,
)
from zoo.tree import KeyPath, path_name

Model = TypeVar("Model", bound=eqx.Module)
# Folded into a layer's dropout key for its adapters' keys, apart from the block's own dropout.
LORA_DROPOUT_STREAM = 0x10DA


class LoRALinear(eqx.Module):
    """`base(x) + (x A^T) B^T * alpha / rank` on the last axis of `x`.

    The base layer sits behind `jax.lax.stop_gradient`: its weights get a zero gradient (and the
    backward pass skips their weight-gradient products), so only `lora_a` and `lora_b` learn.
    With `dropout` > 0, `x` goes through inverted dropout on its way into the adapter (not the
    base) when `dropout_key` is set and `inference` is False, as PEFT's `lora_dropout`.

    Args:
        base: the frozen layer (float `Linear` or int8 / NF4 `QuantizedLinear`).
        lora_a: `A`, `[*layers, rank, in_features]`.
        lora_b: `B`, `[*layers, out_features, rank]`.
        alpha: the scale's numerator (`alpha / rank`).
        dropout: the share of the adapter's inputs dropped in training, in [0, 1).
        dropout_key: the key of this call's dropout (`with_dropout_keys` sets it); None: none.
        inference: True turns the dropout off.
    """

    base: Linear | QuantizedLinear | NF4Linear
    lora_a: Float[Array, "*layers rank in_features"]
    lora_b: Float[Array, "*layers out_features rank"]
    alpha: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True)  # PEFT's lora_dropout: the share of inputs dropped
    dropout_key: PRNGKeyArray | None  # this call's dropout key (None: no dropout)
    inference: bool  # True turns the dropout off (`eqx.nn.inference_mode`)

    def __init__(
        self,
        base: Linear | QuantizedLinear | NF4Linear,
        lora_a: Array,
        lora_b: Array,
        *,
        alpha: float | int,
        dropout: float = 0.0,
        dropout_key: PRNGKeyArray | None = None,
        inference: bool = False,
    ):
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {dropout!r} (0.05 is usual)")
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.alpha = float(alpha)
        self.dropout = float(dropout)
        self.dropout_key = dropout_key
        self.inference = inference

    @staticmethod
    def wrap(
        base: Linear | QuantizedLinear | NF4Linear,
        *,
        rank: int,
        alpha: float | int,
        dropout: float = 0.0,
        key: PRNGKeyArray,
    ) -> LoRALinear:
        """`base` with a fresh adapter: `A` uniform in `±1/sqrt(in_features)`, `B` zero.

        `B = 0` makes the wrapped layer compute exactly what `base` does. `A`'s range is PEFT's
        (`kaiming_uniform_(a=sqrt(5))`). Leading axes of `base.weight` (stacked layers) are kept.
        """
        lead = lead_axes(base)
        bound = 1.0 / math.sqrt(base.in_features)
        dtype = float_dtype(base)
        lora_a = jax.random.uniform(
            key, (*lead, rank, base.in_features), jnp.float32, -bound, bound
        ).astype(dtype)
        lora_b = jnp.zeros((*lead, base.out_features, rank), dtype)
        return LoRALinear(base, lora_a, lora_b, alpha=alpha, dropout=dropout)

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
        dropped = Dropout(self.dropout, inference=self.inference)(x, key=self.dropout_key)
        update = (dropped @ self.lora_a.T) @ self.lora_b.T
        return y + (update * self.scale).astype(y.dtype)


def with_dropout_keys(module: Model, key: PRNGKeyArray | None) -> Model:
    """`module` (one layer's block) with a dropout key in each of its `LoRALinear`s that drops
    (`dropout` > 0): `fold_in(key, i)` for the i-th, a stream apart from the block's own
    dropout keys. Without a key, or without such an adapter, `module` itself."""
    if key is None:
        return module
    count = 0

    def seed(node: object) -> object:
        nonlocal count
        if not isinstance(node, LoRALinear) or node.dropout == 0.0:
            return node
        count += 1
        seeded = jax.random.fold_in(jax.random.fold_in(key, LORA_DROPOUT_STREAM), count)
        return LoRALinear(node.base, node.lora_a, node.lora_b, alpha=node.alpha,
                          dropout=node.dropout, dropout_key=seeded,
                          inference=node.inference)  # fmt: skip

    return jax.tree_util.tree_map(seed, module, is_leaf=is_lora)


class LoRAExperts(eqx.Module):
    """One stacked expert projection `[experts, in, out]` (float or int8, frozen) plus a rank-r
    adapter per expert: `base_e(x) + (x A_e) B_e * alpha / rank` for the rows of expert e.

    `lora_a` is `[experts, in, rank]` and `lora_b` `[experts, rank, out]` (zoo's `[in, out]`
    orientation of the experts; PEFT's per-expert `lora_A` `[rank, in]` is `lora_a[e].T`). The
    adapter runs through the same grouped matmul as the base (`jax.lax.ragged_dot` on the rows
    sorted by expert): no loop over experts, no expert computing a token it was not given.
    """

    base: Float[Array, "*layers experts d_in d_out"] | QuantizedExperts
    lora_a: Float[Array, "*layers experts d_in rank"]
    lora_b: Float[Array, "*layers experts rank d_out"]
    alpha: float = eqx.field(static=True)

    def __init__(
        self,
        base: Array | QuantizedExperts,
        lora_a: Array,
        lora_b: Array,
        *,
        alpha: float | int,
    ):
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.alpha = float(alpha)

    @staticmethod
    def wrap(
        base: Array | QuantizedExperts, *, rank: int, alpha: float | int, key: PRNGKeyArray
    ) -> LoRAExperts:
        """`base` with fresh adapters: `A` uniform in `±1/sqrt(in)` (PEFT's range), `B` zero, so
        the result computes exactly what `base` does. Leading axes (stacked layers) are kept."""
        *lead, d_in, d_out = base.shape
        bound = 1.0 / math.sqrt(d_in)
        dtype = float_dtype(base)
        lora_a = jax.random.uniform(key, (*lead, d_in, rank), jnp.float32, -bound, bound)
        lora_b = jnp.zeros((*lead, rank, d_out), dtype)
        return LoRAExperts(base, lora_a.astype(dtype), lora_b, alpha=alpha)

    @property
    def shape(self) -> tuple[int, ...]:
        """The base's shape (`[*layers, experts, in, out]`)."""
        return tuple(self.base.shape)

    @property
    def rank(self) -> int:
        return self.lora_a.shape[-1]

    @property
    def scale(self) -> float:
        """`alpha / rank`: PEFT's `scaling`."""
        return self.alpha / self.rank

    def delta(self) -> Float[Array, "*layers experts d_in d_out"]:
        """The update added to the base experts: `scale * A @ B` per expert, in float32."""
        a, b = self.lora_a.astype(jnp.float32), self.lora_b.astype(jnp.float32)
        return jnp.einsum("...ir,...ro->...io", a, b) * self.scale

    def grouped(
        self, rows: Float[Array, "rows d_in"], group_sizes: Int[Array, " experts"]
    ) -> Float[Array, "rows d_out"]:
        """`rows` sorted by expert through their experts' projections and adapters."""
        base = jax.lax.stop_gradient(self.base)
        if isinstance(base, QuantizedExperts):
            y = base.grouped(rows, group_sizes)
        else:
            y = grouped_matmul(rows, base, group_sizes)
        low = grouped_matmul(rows, self.lora_a.astype(rows.dtype), group_sizes)
        update = grouped_matmul(low, self.lora_b.astype(rows.dtype), group_sizes)
        return y + (update * self.scale).astype(y.dtype)

    def every(self, x: Float[Array, "*lead seq d_in"]) -> Float[Array, "experts seq d_out"]:
        """Every row through every expert (the dense reference); `x` may carry `experts`."""
        base = jax.lax.stop_gradient(self.base)
        spec = "esd,edf->esf" if x.ndim == 3 else "sd,edf->esf"
        y = base.every(x) if isinstance(base, QuantizedExperts) else jnp.einsum(spec, x, base)
        update = jnp.einsum("esr,erf->esf", jnp.einsum(spec, x, self.lora_a), self.lora_b)
        return y + (update * self.scale).astype(y.dtype)


def expert_projections(model: eqx.Module) -> dict[str, Array | QuantizedExperts]:
    """Every stacked expert projection without an adapter, by path
    (`layers.blocks.feed_forward.experts.gate`): float arrays and `QuantizedExperts`."""
    out: dict[str, Array | QuantizedExperts] = {}
    for path, experts in expert_modules(model).items():
        for name in PROJECTIONS:
            projection = getattr(experts, name)
            if eqx.is_array(projection) or isinstance(projection, QuantizedExperts):
                out[f"{path}.{name}"] = projection
    return out


def lora_experts(model: eqx.Module) -> dict[str, LoRAExperts]:
    """Every `LoRAExperts` of `model` by path (`layers.blocks.feed_forward.experts.up`)."""
    return {
        f"{path}.{name}": getattr(experts, name)
        for path, experts in expert_modules(model).items()
        for name in PROJECTIONS
        if isinstance(getattr(experts, name), LoRAExperts)
    }


class AdapterShape(TypedDict):
    """What `zoo.save` records of one adapter (in `config.json`'s `"lora"`)."""

    rank: int
    alpha: float
    dropout: NotRequired[float]  # recorded where > 0


def is_linear(node: object) -> bool:
    """A plain `Linear` or an int8 / NF4 one (all take adapters)."""
    return isinstance(node, Linear | QuantizedLinear | NF4Linear)


def is_lora(node: object) -> bool:
    return isinstance(node, LoRALinear)


def plain_linears(model: eqx.Module) -> dict[str, Linear | QuantizedLinear | NF4Linear]:
    """Every `Linear` of `model` keyed by its path, in pytree order (not those in a LoRALinear)."""

    def stop(node: object) -> bool:
        return isinstance(node, Linear | QuantizedLinear | NF4Linear | LoRALinear)

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
    return bool(lora_layers(model)) or bool(lora_experts(model))


def replace_at(
    model: Model, replace: Mapping[str, eqx.Module], is_leaf: Callable[[object], bool]
) -> Model:
    """`model` with the nodes at the given paths (found with `is_leaf`) replaced."""

    def swap(path: KeyPath, node: object) -> object:
        return replace.get(path_name(path), node) if is_leaf(node) else node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=is_leaf)


def describe(model: eqx.Module) -> dict[str, AdapterShape]:
    """Rank and alpha of every adapter, by Linear (or expert projection) path: what `rebuild`
    needs to restore them."""
    layers: dict[str, LoRALinear | LoRAExperts] = {**lora_layers(model), **lora_experts(model)}
    shapes: dict[str, AdapterShape] = {}
    for path, layer in layers.items():
        shapes[path] = {"rank": layer.rank, "alpha": layer.alpha}
        if isinstance(layer, LoRALinear) and layer.dropout > 0:
            shapes[path]["dropout"] = layer.dropout
    return shapes


def rebuild(model: Model, layout: Mapping[str, AdapterShape]) -> Model:
    """`model` with adapters of the ranks in `layout` (from `describe`) at the same paths.

    The adapter values are placeholders (to be filled from a file): `A` is zero like `B`.
    """
    linears = plain_linears(model)
    projections = expert_projections(model)
    missing = sorted(set(layout) - set(linears) - set(projections))
    if missing:
        raise ValueError(
            f"the saved adapters sit on Linear layers this model lacks: {missing}; "
            f"its Linear layers are {', '.join([*linears, *projections])}"
        )
    experts = {}
    for path, entry in layout.items():
        if path in projections:
            base, rank = projections[path], int(entry["rank"])
            *dims, d_in, d_out = base.shape
            dtype = float_dtype(base)
            lora_a = jnp.zeros((*dims, d_in, rank), dtype)
            lora_b = jnp.zeros((*dims, rank, d_out), dtype)
            experts[path] = LoRAExperts(base, lora_a, lora_b, alpha=float(entry["alpha"]))
    model = replace_projections(model, experts)
    wrapped = {}
    for path, entry in layout.items():
        if path in experts:
            continue
        linear = linears[path]
        lead = lead_axes(linear)
        dtype = float_dtype(linear)
        rank = int(entry["rank"])
        lora_a = jnp.zeros((*lead, rank, linear.in_features), dtype)
        lora_b = jnp.zeros((*lead, linear.out_features, rank), dtype)
        dropout = float(entry.get("dropout", 0.0))
        wrapped[path] = LoRALinear(
            linear, lora_a, lora_b, alpha=float(entry["alpha"]), dropout=dropout
        )
    return replace_at(model, wrapped, is_linear)
