"""Flat, per-layer names for the arrays of a zoo model, like the keys of a torch state dict.

`layers.blocks.self_attention.query_proj.weight` has a leading `layers` axis; here it becomes one
key per layer: `layers.0.self_attention.query_proj.weight`, `layers.1...`. A stack of several
kinds of layer holds one group per kind (`layers.blocks.1.feed_forward...`); its rows become the
keys of the layers that group holds (`zoo.nn.LayerIndex`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import equinox as eqx
import jax
import numpy as np

from zoo.interop.rules import Shape
from zoo.nn.layer_index import LayerIndex
from zoo.tree import KeyPath, Slot, is_slot, path_name

Model = TypeVar("Model", bound=eqx.Module)


def row_names(name: str, index: LayerIndex) -> list[tuple[str, int | None]]:
    """The flat key of each row of the stacked array or layer `name`, with its row
    (`layers.blocks.1.x` -> `layers.3.x` for row 0 when group 1 holds layers 3, 7, ...); a name
    outside every layer stack is its own key: `[(name, None)]`."""
    found = index.layer_names(name)
    if found is None:
        return [(name, None)]
    return [(flat, row) for flat, row in found]


def _array_leaves(model: eqx.Module) -> list[tuple[KeyPath, Slot]]:
    """Each array (or `ShapeDtypeStruct`) of `model` with its key path."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_slot)
    return [(path, leaf) for path, leaf in leaves if is_slot(leaf)]


def _per_layer(model: eqx.Module) -> Iterator[tuple[str, int | None, Slot]]:
    """Each flat key of `model` with its layer index (None: not stacked) and its whole leaf;
    the index is the row of the leaf's stacked axis."""
    index = LayerIndex(model)
    for path, leaf in _array_leaves(model):
        for name, row in row_names(path_name(path), index):
            yield name, row, leaf


def zoo_shapes(model: eqx.Module) -> dict[str, Shape]:
    """Flat per-layer key -> shape of every array in `model` (arrays or `ShapeDtypeStruct`s)."""
    return {
        name: tuple(leaf.shape) if index is None else tuple(leaf.shape[1:])
        for name, index, leaf in _per_layer(model)
    }


def zoo_state(model: eqx.Module) -> dict[str, np.ndarray]:
    """Flat per-layer key -> numpy array of every array in `model`."""
    state = {}
    index = LayerIndex(model)
    for path, leaf in _array_leaves(model):
        array = np.asarray(leaf)  # to the host once, then sliced per layer
        for name, row in row_names(path_name(path), index):
            state[name] = array if row is None else array[row]
    return state


def zoo_arrays(model: eqx.Module, names: Sequence[str]) -> dict[str, jax.Array]:
    """The jax arrays of `model` at the flat per-layer keys `names` (usable under `jax.jit`)."""
    wanted = set(names)
    return {
        name: leaf if index is None else leaf[index]
        for name, index, leaf in _per_layer(model)
        if name in wanted and isinstance(leaf, jax.Array)  # under jit: every leaf
    }


def restack(skeleton: eqx.Module, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays of `skeleton` by path name (`zoo.tree.fill` puts them in), taken from the flat
    per-layer `state`: the layers of a stacked leaf are stacked back on its `layers` axis."""
    arrays = {}
    index = LayerIndex(skeleton)
    for path, _ in _array_leaves(skeleton):
        names = row_names(path_name(path), index)
        if names[0][1] is None:
            arrays[path_name(path)] = state[names[0][0]]
        else:
            arrays[path_name(path)] = np.stack([state[name] for name, _ in names])
    return arrays


def abstract_model(build: Callable[[], Model]) -> Model:
    """The model `build` makes, as shapes only (no memory for weights)."""
    return eqx.filter_eval_shape(build)
