"""LoRA as tree operations on an immutable model: `apply`, `merge`, `unmerge`, and what trains.

```python
lora_model = zoo.lora.apply(model, rank=8, alpha=16, targets="attention", key=key)
optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-3))    # state for the adapters only
...
merged = zoo.lora.merge(lora_model)                          # a plain model again
```
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, PRNGKeyArray, PyTree

from zoo.lora.targets import normalize_targets, select
from zoo.nn.lora import (
    LoRAExperts,
    LoRALinear,
    expert_projections,
    has_lora,
    is_linear,
    is_lora,
    lora_experts,
    lora_layers,
    plain_linears,
    replace_at,
)
from zoo.nn.quantized import (
    QuantizedExperts,
    as_float,
    dequantize,
    replace_projections,
    weight_shape,
)
from zoo.nn.stack import LayerStack
from zoo.train.freeze import train_only
from zoo.train.optim import Optimizer
from zoo.tree import KeyPath, path_name

ADAPTER_LEAVES = ("lora_a", "lora_b")
# What an adapted model's layers recompute in the backward pass when its config chose nothing:
# everything but each layer's input. Kept for every layer, the frozen base's intermediates were
# most of a LoRA step's memory (docs/benchmarks.md: SmolLM2-135M, batch 8 x 128, XLA
# temporaries 3.02 GB kept, 1.84 GB keeping the matrix products ("dots"), 0.88 GB "full").
ADAPTED_REMAT = "full"
Model = TypeVar("Model", bound=eqx.Module)
Module = TypeVar("Module", bound=eqx.Module)


def _check_numbers(rank: int, alpha: float | int, dropout: float | int) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r} (8 or 16 are usual)")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be positive, got {alpha!r} (often 2 * rank)")
    if isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        raise ValueError(
            f"LoRA dropout must be a share of the inputs in [0, 1), got {dropout!r} (0.05 or "
            "0.1 are usual; 0 turns it off)"
        )


def apply(
    model: Model,
    *,
    rank: int = 8,
    alpha: float | int = 16.0,
    targets: str | Sequence[str] = "attention",
    dropout: float | int = 0.0,
    key: PRNGKeyArray,
) -> Model:
    """`model` with the chosen `Linear`s wrapped in `LoRALinear` (A random, B zero).

    The result computes exactly what `model` computes until the adapters are trained. `targets`
    are group names (`attention`, `attention.qv`, `attention.qkv`, `feedforward`, `experts`,
    `all-linear`) or patterns over Linear and expert projection paths (see `zoo.lora.targets`),
    as a list or a comma-separated string. `dropout` drops that share of each adapter's inputs
    in training (PEFT's `lora_dropout`; Linear adapters inside the layer stack). Stacked layers (`LayerStack`) get stacked adapters:
    `lora_a` is `[layers, rank, in]`. A mixture of experts' projections get one adapter per
    expert (`LoRAExperts`, `lora_a` `[layers, experts, in, rank]`); its router stays frozen.

    A model whose config sets no `remat` (or "auto") gets `remat="full"` (`ADAPTED_REMAT`): the
    backward pass keeps each layer's input only and recomputes the layer's forward, which saves
    most of the step's memory for one more forward pass of the layers. Set `remat` in the config before
    `apply` to choose another policy ("dots" keeps the matrix products).
    """
    _check_numbers(rank, alpha, dropout)
    if has_lora(model):
        raise ValueError(
            "this model already has LoRA adapters; merge them first (zoo.lora.merge) to stack "
            "another adapter on top"
        )
    linears = plain_linears(model)
    projections = expert_projections(model)
    chosen = select([*linears, *projections], normalize_targets(targets))
    stacked = _stacked_linears(model) if dropout else set()
    wrapped: dict[str, eqx.Module] = {}
    experts: dict[str, object] = {}
    for index, path in enumerate(chosen):
        d_in, d_out = (
            projections[path].shape[-2:]
            if path in projections
            else (linears[path].in_features, linears[path].out_features)
        )
        if rank > min(d_in, d_out):
            raise ValueError(
                f"LoRA rank {rank} exceeds the width of {path} ({d_in} -> {d_out}); choose "
                f"rank <= {min(d_in, d_out)}"
            )
        layer_key = jax.random.fold_in(key, index)
        if dropout and (path in projections or path not in stacked):
            raise ValueError(
                f"LoRA dropout={dropout} reaches the adapters of the layer stack's Linear layers, "
                f"not {path}: drop dropout, or leave {path} out of the targets"
            )
        if path in projections:
            experts[path] = LoRAExperts.wrap(
                projections[path], rank=rank, alpha=alpha, key=layer_key
            )
        else:
            wrapped[path] = LoRALinear.wrap(
                linears[path], rank=rank, alpha=alpha, dropout=float(dropout), key=layer_key
            )
    model = replace_projections(replace_at(model, wrapped, is_linear), experts)
    return _with_default_remat(model)


def _stacked_linears(model: eqx.Module) -> set[str]:
    """The paths of the `Linear`s inside a `LayerStack` (whose adapters get dropout keys)."""

    def is_stack(node: object) -> bool:
        return isinstance(node, LayerStack)

    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_stack)
    return {
        f"{path_name(path)}.{inner}"
        for path, node in flat
        if is_stack(node)
        for inner in plain_linears(node)
    }


def _with_static(module: Module, **fields: object) -> Module:
    """A copy of `module` with static (non-array) fields changed; arrays are shared."""
    changed = copy.copy(module)
    for name, value in fields.items():
        object.__setattr__(changed, name, value)
    return changed


def _with_default_remat(model: Model) -> Model:
    """`model` with `ADAPTED_REMAT` in its config and layer stacks where they have none."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "remat", "unset") not in (None, "auto"):
        return model

    def recompute(node: object) -> object:
        if isinstance(node, LayerStack) and node.remat in (None, "auto"):
            return _with_static(node, remat=ADAPTED_REMAT)
        return node

    def is_stack(node: object) -> bool:
        return isinstance(node, LayerStack)

    model = jax.tree_util.tree_map(recompute, model, is_leaf=is_stack)
    return _with_static(model, config=dataclasses.replace(config, remat=ADAPTED_REMAT))


def merge(model: Model) -> Model:
    """A plain model: every `LoRALinear` becomes a `Linear` with `W + alpha/rank * B A`.

    An int8 base (`zoo.lora.quantize`) is dequantized (`W = q * scale`): the result is float.
    The merged model computes what the adapted one does (up to float32 rounding), exports with
    `zoo.to_hf` and saves with `zoo.save` like any model.
    """
    merged: dict[str, eqx.Module] = {}
    for path, layer in lora_layers(model).items():
        base = as_float(layer.base)
        folded = (base.weight.astype(jnp.float32) + layer.delta()).astype(base.weight.dtype)
        merged[path] = eqx.tree_at(lambda linear: linear.weight, base, folded)
    experts: dict[str, object] = {}
    for path, projection in lora_experts(model).items():
        weight = _float_base(projection.base)
        experts[path] = (weight.astype(jnp.float32) + projection.delta()).astype(weight.dtype)
    if not merged and not experts:
        raise ValueError("this model has no LoRA adapters to merge (see zoo.lora.apply)")
    return dequantize(replace_projections(replace_at(model, merged, is_lora), experts))


def _float_base(base: Array | QuantizedExperts) -> Array:
    return base.dequantize() if isinstance(base, QuantizedExperts) else base


def unmerge(merged: Model, adapted: eqx.Module) -> Model:
    """`adapted` with its base weights recovered from `merged` (`W = W_merged - alpha/rank B A`).

    The inverse of `merge`: `unmerge(merge(m), m)` equals `m` up to float32 rounding, so a model
    merged for fast inference can go back to training its adapters.
    """
    layers = lora_layers(adapted)
    adapted_experts = lora_experts(adapted)
    if not layers and not adapted_experts:
        raise ValueError("the adapted model has no LoRA adapters (see zoo.lora.apply)")
    projections = expert_projections(merged)
    experts: dict[str, object] = {}
    for path, projection in adapted_experts.items():
        if path not in projections or projections[path].shape != projection.shape:
            raise ValueError(
                f"the merged model has no expert projection {path} of shape {projection.shape}; "
                "pass the model that zoo.lora.merge returned for this adapted model"
            )
        weight = _float_base(projections[path])
        base = (weight.astype(jnp.float32) - projection.delta()).astype(weight.dtype)
        experts[path] = LoRAExperts(
            base, projection.lora_a, projection.lora_b, alpha=projection.alpha
        )
    merged = replace_projections(merged, experts)
    plain = plain_linears(merged)
    restored: dict[str, eqx.Module] = {}
    for path, layer in layers.items():
        if path not in plain or weight_shape(plain[path]) != weight_shape(layer.base):
            raise ValueError(
                f"the merged model has no Linear {path} of shape {weight_shape(layer.base)}; "
                "pass the model that zoo.lora.merge returned for this adapted model"
            )
        found = plain[path]
        linear = as_float(found)
        weight = linear.weight
        base_weight = (weight.astype(jnp.float32) - layer.delta()).astype(weight.dtype)
        base = eqx.tree_at(lambda node: node.weight, linear, base_weight)
        restored[path] = LoRALinear(
            base, layer.lora_a, layer.lora_b, alpha=layer.alpha, dropout=layer.dropout
        )
    return replace_at(merged, restored, is_linear)


def _is_trained(name: str, train: Sequence[str]) -> bool:
    if name.split(".")[-1] in ADAPTER_LEAVES:
        return True
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in train)


def trainable_labels(params: PyTree, train: Sequence[str] = ()) -> PyTree[str]:
    """ "train" for the adapter arrays (and arrays under the `train` path prefixes), else "frozen"."""

    def label(path: KeyPath, leaf: object) -> str:
        return "train" if _is_trained(path_name(path), train) else "frozen"

    return jax.tree_util.tree_map_with_path(label, params)


def check_train(model: eqx.Module, train: Sequence[str]) -> None:
    """Each `train` prefix must name arrays of `model` (e.g. `head` for a new classifier head)."""
    names = [
        path_name(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(eqx.filter(model, eqx.is_inexact_array))[0]
    ]
    for prefix in train:
        if not any(name == prefix or name.startswith(f"{prefix}.") for name in names):
            tops = sorted({name.split(".")[0] for name in names})
            raise ValueError(
                f"LoRA train={prefix!r} names no parameter; give a path prefix such as "
                f"{', '.join(tops)}"
            )


def only_adapters(
    optimizer: Optimizer | optax.GradientTransformation, *, train: Sequence[str] = ()
) -> Optimizer:
    """`optimizer` restricted to the adapters (plus arrays under the `train` prefixes).

    Every other array gets an update of exactly 0 and no optimizer state at all (an
    `optax.multi_transform` over "train"/"frozen" labels), so AdamW's moments are the size of
    the adapters.
    """
    train = tuple(train)
    return train_only(optimizer, lambda params: trainable_labels(params, train), ("lora", train))


def adapter_arrays(model: eqx.Module, train: Sequence[str] = ()) -> dict[str, Array]:
    """The trained arrays of an adapted model keyed by path: adapters and `train` extras."""
    params = eqx.filter(model, eqx.is_inexact_array)
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {path_name(p): leaf for p, leaf in flat if _is_trained(path_name(p), train)}
