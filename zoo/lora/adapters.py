"""LoRA as tree operations on an immutable model: `apply`, `merge`, `unmerge`, and what trains.

```python
lora_model = zoo.lora.apply(model, rank=8, alpha=16, targets="attention", key=key)
optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-3))    # state for the adapters only
...
merged = zoo.lora.merge(lora_model)                          # a plain model again
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from zoo.lora.linear import LoRALinear
from zoo.lora.quantized import QuantizedLinear, dequantize, float_dtype
from zoo.lora.targets import (
    is_linear,
    linear_paths,
    normalize_targets,
    plain_linears,
    select,
)
from zoo.serialize import path_name
from zoo.train.freeze import train_only
from zoo.train.optim import Optimizer

ADAPTER_LEAVES = ("lora_a", "lora_b")


def is_lora(node: Any) -> bool:
    return isinstance(node, LoRALinear)


def lora_layers(model: Any) -> dict[str, LoRALinear]:
    """Every `LoRALinear` of `model` keyed by its path (e.g. `layers.blocks.self_attention.query_proj`)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_lora)
    return {path_name(path): node for path, node in flat if is_lora(node)}


def has_lora(model: Any) -> bool:
    return bool(lora_layers(model))


def _check_numbers(rank: int, alpha: float | int, dropout: float | int) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r} (8 or 16 are usual)")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be positive, got {alpha!r} (often 2 * rank)")
    if dropout != 0.0:
        raise ValueError(
            f"LoRA dropout={dropout} is not supported: zoo's layers call their Linears without a "
            "dropout key; use dropout=0.0 (the model's own dropout still applies)"
        )


def _replace(model: Any, replace: dict[str, Any], is_leaf) -> Any:
    """`model` with the nodes at the given paths (found with `is_leaf`) replaced."""

    def swap(path, node):
        return replace.get(path_name(path), node) if is_leaf(node) else node

    return jax.tree_util.tree_map_with_path(swap, model, is_leaf=is_leaf)


def apply(
    model: Any,
    *,
    rank: int = 8,
    alpha: float | int = 16.0,
    targets: str | Sequence[str] = "attention",
    dropout: float | int = 0.0,
    key: PRNGKeyArray,
) -> Any:
    """`model` with the chosen `Linear`s wrapped in `LoRALinear` (A random, B zero).

    The result computes exactly what `model` computes until the adapters are trained. `targets`
    are group names (`attention`, `attention.qv`, `attention.qkv`, `feedforward`, `all-linear`)
    or patterns over Linear paths (see `zoo.lora.targets`), as a list or a comma-separated string.
    Stacked layers (`LayerStack`) get stacked adapters: `lora_a` is `[layers, rank, in]`.
    """
    _check_numbers(rank, alpha, dropout)
    if has_lora(model):
        raise ValueError(
            "this model already has LoRA adapters; merge them first (zoo.lora.merge) to stack "
            "another adapter on top"
        )
    linears = plain_linears(model)
    chosen = select(linears, normalize_targets(targets))
    wrapped = {}
    for index, path in enumerate(chosen):
        linear = linears[path]
        width = min(linear.in_features, linear.out_features)
        if rank > width:
            raise ValueError(
                f"LoRA rank {rank} exceeds the width of {path} ({linear.in_features} -> "
                f"{linear.out_features}); choose rank <= {width}"
            )
        layer_key = jax.random.fold_in(key, index)
        wrapped[path] = LoRALinear.wrap(linear, rank=rank, alpha=alpha, key=layer_key)
    return _replace(model, wrapped, is_linear)


def merge(model: Any) -> Any:
    """A plain model: every `LoRALinear` becomes a `Linear` with `W + alpha/rank * B A`.

    An int8 base (`zoo.lora.quantize`) is dequantized (`W = q * scale`): the result is float.
    The merged model computes what the adapted one does (up to float32 rounding), exports with
    `zoo.to_hf` and saves with `zoo.save` like any model.
    """
    merged = {}
    for path, layer in lora_layers(model).items():
        base = layer.base.dequantize() if isinstance(layer.base, QuantizedLinear) else layer.base
        folded = (base.weight.astype(jnp.float32) + layer.delta()).astype(base.weight.dtype)
        merged[path] = eqx.tree_at(lambda linear: linear.weight, base, folded)
    if not merged:
        raise ValueError("this model has no LoRA adapters to merge (see zoo.lora.apply)")
    return dequantize(_replace(model, merged, is_lora))


def unmerge(merged: Any, adapted: Any) -> Any:
    """`adapted` with its base weights recovered from `merged` (`W = W_merged - alpha/rank B A`).

    The inverse of `merge`: `unmerge(merge(m), m)` equals `m` up to float32 rounding, so a model
    merged for fast inference can go back to training its adapters.
    """
    layers = lora_layers(adapted)
    if not layers:
        raise ValueError("the adapted model has no LoRA adapters (see zoo.lora.apply)")
    plain = plain_linears(merged)
    restored = {}
    for path, layer in layers.items():
        if path not in plain or plain[path].weight.shape != layer.base.weight.shape:
            raise ValueError(
                f"the merged model has no Linear {path} of shape {layer.base.weight.shape}; "
                "pass the model that zoo.lora.merge returned for this adapted model"
            )
        linear = plain[path]
        if isinstance(linear, QuantizedLinear):
            linear = linear.dequantize()
        weight = linear.weight
        base_weight = (weight.astype(jnp.float32) - layer.delta()).astype(weight.dtype)
        base = eqx.tree_at(lambda node: node.weight, linear, base_weight)
        restored[path] = LoRALinear(base, layer.lora_a, layer.lora_b, alpha=layer.alpha)
    return _replace(merged, restored, is_linear)


def _is_trained(name: str, train: Sequence[str]) -> bool:
    if name.split(".")[-1] in ADAPTER_LEAVES:
        return True
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in train)


def trainable_labels(params: Any, train: Sequence[str] = ()) -> Any:
    """ "train" for the adapter arrays (and arrays under the `train` path prefixes), else "frozen"."""

    def label(path, leaf):
        return "train" if _is_trained(path_name(path), train) else "frozen"

    return jax.tree_util.tree_map_with_path(label, params)


def check_train(model: Any, train: Sequence[str]) -> None:
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


def only_adapters(optimizer: Any, *, train: Sequence[str] = ()) -> Optimizer:
    """`optimizer` restricted to the adapters (plus arrays under the `train` prefixes).

    Every other array gets an update of exactly 0 and no optimizer state at all (an
    `optax.multi_transform` over "train"/"frozen" labels), so AdamW's moments are the size of
    the adapters.
    """
    train = tuple(train)
    return train_only(optimizer, lambda params: trainable_labels(params, train), ("lora", train))


def adapter_arrays(model: Any, train: Sequence[str] = ()) -> dict[str, Any]:
    """The trained arrays of an adapted model keyed by path: adapters and `train` extras."""
    params = eqx.filter(model, eqx.is_inexact_array)
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {path_name(p): leaf for p, leaf in flat if _is_trained(path_name(p), train)}


def describe(model: Any) -> dict[str, Any]:
    """Rank and alpha of every adapter, by Linear path: what `rebuild` needs to restore them."""
    return {
        path: {"rank": layer.rank, "alpha": layer.alpha}
        for path, layer in lora_layers(model).items()
    }


def rebuild(model: Any, layout: dict[str, Any]) -> Any:
    """`model` with adapters of the ranks in `layout` (from `describe`) at the same paths.

    The adapter values are placeholders (to be filled from a file): `A` is zero like `B`.
    """
    linears = plain_linears(model)
    missing = sorted(set(layout) - set(linears))
    if missing:
        raise ValueError(
            f"the saved adapters sit on Linear layers this model lacks: {missing}; "
            f"its Linear layers are {', '.join(linear_paths(model))}"
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
    return _replace(model, wrapped, is_linear)
