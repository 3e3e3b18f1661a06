"""Flat, per-layer names for the arrays of a zoo model, like the keys of a torch state dict.

`layers.blocks.self_attention.query_proj.weight` has a leading `layers` axis; here it becomes one
key per layer: `layers.0.self_attention.query_proj.weight`, `layers.1...`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from zoo.interop.convert import CheckpointMismatch
from zoo.interop.rules import Shape
from zoo.serialize import path_parts

STACK_FIELD = "blocks"  # LayerStack.blocks: arrays with a leading `layers` axis


def _is_leaf_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _leaf_names(path: tuple[Any, ...], shape: Shape) -> list[tuple[str, int | None]]:
    """The flat key(s) of one leaf: one per layer for stacked leaves (with the layer index)."""
    parts = path_parts(path)
    if STACK_FIELD not in parts:
        return [(".".join(parts), None)]
    at = parts.index(STACK_FIELD)
    return [
        (".".join([*parts[:at], str(index), *parts[at + 1 :]]), index) for index in range(shape[0])
    ]


def zoo_shapes(model: Any) -> dict[str, Shape]:
    """Flat per-layer key -> shape of every array in `model` (arrays or `ShapeDtypeStruct`s)."""
    shapes = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=_is_leaf_array)
    for path, leaf in leaves:
        if not _is_leaf_array(leaf):
            continue
        for name, index in _leaf_names(path, tuple(leaf.shape)):
            shapes[name] = tuple(leaf.shape) if index is None else tuple(leaf.shape[1:])
    return shapes


def zoo_state(model: Any, *, as_numpy: bool = True) -> dict[str, Any]:
    """Flat per-layer key -> array of every array in `model`.

    numpy arrays by default; `as_numpy=False` keeps jax arrays (usable under `jax.jit`).
    """
    state = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=_is_leaf_array)
    for path, leaf in leaves:
        if not _is_leaf_array(leaf):
            continue
        array = np.asarray(leaf) if as_numpy else leaf
        for name, index in _leaf_names(path, tuple(array.shape)):
            state[name] = array if index is None else array[index]
    return state


def fill(skeleton: Any, state: Mapping[str, np.ndarray]) -> Any:
    """`skeleton` (e.g. from `eqx.filter_eval_shape`) with its arrays taken from `state`.

    Arrays are cast to the skeleton's dtypes; stacked leaves are stacked back on `layers`.
    """

    def take(path, leaf):
        if not _is_leaf_array(leaf):
            return leaf
        names = _leaf_names(path, tuple(leaf.shape))
        if names[0][1] is None:
            array = state[names[0][0]]
        else:
            array = np.stack([state[name] for name, _ in names])
        if tuple(array.shape) != tuple(leaf.shape):
            raise CheckpointMismatch(
                f"{names[0][0]}: got shape {tuple(array.shape)}, the model needs {tuple(leaf.shape)}"
            )
        return jnp.asarray(array, dtype=leaf.dtype)

    return jax.tree_util.tree_map_with_path(take, skeleton, is_leaf=_is_leaf_array)


def abstract_model(build: Callable[[], eqx.Module]) -> Any:
    """The model `build` makes, as shapes only (no memory for weights)."""
    return eqx.filter_eval_shape(build)
