"""Pytree paths as dotted names, and the arrays of a tree by those names, out and back in.

A path such as `(GetAttrKey('layers'), GetAttrKey('blocks'), ..., GetAttrKey('weight'))` is
named `layers.blocks.self_attention.query_proj.weight`: the names of saved files
(`model.safetensors`, checkpoints), LoRA targets, freezing and partition rules all use them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

Tree = TypeVar("Tree")
# a pytree key path: GetAttrKey, DictKey, SequenceKey, ... entries (any object a node names)
KeyPath = Sequence[object]
# an array slot of a tree: an array, or its shape and dtype (after `eqx.filter_eval_shape`)
Slot = jax.Array | np.ndarray | jax.ShapeDtypeStruct


def path_parts(path: KeyPath) -> list[str]:
    """The attribute names, dict keys and sequence indices of a pytree key path."""
    parts = []
    for entry in path:
        for attribute in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
        else:
            parts.append(str(entry))
    return parts


def path_name(path: KeyPath) -> str:
    """A pytree key path as a dotted name: `layers.blocks.self_attention.query_proj.weight`."""
    return ".".join(path_parts(path))


def is_slot(leaf: object) -> bool:
    """An array, or the shape of one (`jax.ShapeDtypeStruct`)."""
    return eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def named_arrays(tree: object) -> dict[str, Slot]:
    """Every array leaf of `tree` (or shape, after `filter_eval_shape`) keyed by its path name."""
    flat, _ = jax.tree_util.tree_flatten_with_path(eqx.filter(tree, is_slot))
    return {path_name(path): leaf for path, leaf in flat}


def fill(
    skeleton: Tree,
    arrays: Mapping[str, np.ndarray | jax.Array],
    source: str,
    *,
    partial: bool = False,
) -> Tree:
    """`skeleton` with the array at each path name taken from `arrays`, cast to its dtype.

    The skeleton is any pytree: a model built under `eqx.filter_eval_shape`, an optimizer state.
    Every name in `arrays` must be a slot of `skeleton` with the same shape, and every slot must
    be named unless `partial` (which keeps the skeleton's own arrays where `arrays` has none).
    Errors are `ValueError`s that start with `source` (the file the arrays came from).
    """
    expected = named_arrays(skeleton)
    missing = [] if partial else sorted(set(expected) - set(arrays))
    unexpected = sorted(set(arrays) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing arrays {missing}, unexpected arrays {unexpected}")
    leaves = []
    for name, slot in expected.items():
        if name not in arrays:
            leaves.append(slot)
            continue
        value = arrays[name]
        if tuple(value.shape) != tuple(slot.shape):
            raise ValueError(
                f"{source}: array {name!r} has shape {tuple(value.shape)}, "
                f"expected {tuple(slot.shape)}"
            )
        leaves.append(jnp.asarray(value, dtype=slot.dtype))
    slots, rest = eqx.partition(skeleton, is_slot)
    return eqx.combine(
        jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(slots), leaves), rest
    )


Module = TypeVar("Module", bound=eqx.Module)


def with_fields(module: Module, **changes: object) -> Module:
    """A copy of the Equinox `module` with the named fields set, static ones included (which
    `eqx.tree_at` cannot reach): the same arrays, another configuration of them."""
    names = {field.name for field in dataclasses.fields(module)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"{type(module).__name__} has no field(s) {unknown}")
    changed = copy.copy(module)
    for name, value in changes.items():
        object.__setattr__(changed, name, value)
    return changed
