"""Decoding on a mesh: where the model, the prompts and the KV cache live.

The decoding functions take `mesh=`: a `jax.sharding.Mesh` or a string like
`"data=2,fsdp=2,tensor=2"`, as the Trainer does, or a `zoo.distributed.Layout` (a mesh and its
partition rules: `Layout.of(mesh, rules)` for rules other than `zoo.distributed.RULES`). The
model goes onto the shardings of the partition rules (`zoo.distributed.Layout.place`; a model
already there is used as it is), the prompts or sources are split by rows over `data x fsdp`
when their number divides it and copied whole to every device otherwise. The models never see
the mesh: this is all at the `jit` boundary.

The KV cache needs no sharding constraint: XLA's propagation from the placed model and prompts
keeps it split inside the compiled loop, with the prompts' rows and its key/value heads over
`tensor` (checked in the compiled HLO: per device `[rows / (data x fsdp), layers, positions,
kv_heads / tensor, head_dim]`). Explicit `with_sharding_constraint`s there only added
collectives and temporary memory.
"""

from __future__ import annotations

from typing import TypeVar, overload

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, Sharding

from zoo.distributed.layout import Layout


def decoding_layout(mesh: Mesh | str | Layout | None) -> Layout | None:
    """The `Layout` of `mesh` (a `Layout` as it is, a mesh with `zoo.distributed.RULES`); None
    without a mesh."""
    if mesh is None or isinstance(mesh, Layout):
        return mesh
    return Layout.of(mesh)


Model = TypeVar("Model", bound=eqx.Module)
RowArray = np.ndarray | jax.Array  # a `[batch, ...]` array, on the host or on devices


def place_model(layout: Layout | None, model: Model) -> Model:
    """`model` on the shardings of `layout`'s rules; as it is when it is already there."""
    if layout is None:
        return model
    arrays = eqx.filter(model, eqx.is_array)
    wanted = layout.shardings(arrays)  # also checks that `tensor` divides the heads

    def placed(array: object, sharding: Sharding) -> bool:
        return isinstance(array, jax.Array) and array.sharding.is_equivalent_to(
            sharding, array.ndim
        )

    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(placed, arrays, wanted))
    return model if all(leaves) else layout.place(model)


@overload
def place_rows(layout: Layout | None, *arrays: RowArray) -> tuple[jax.Array, ...]: ...
@overload
def place_rows(layout: Layout | None, *arrays: RowArray | None) -> tuple[jax.Array | None, ...]: ...
def place_rows(layout: Layout | None, *arrays: RowArray | None) -> tuple[jax.Array | None, ...]:
    """Each `[batch, ...]` array split by rows over `data x fsdp` when `batch` divides it,
    else copied whole to every device (without a layout: onto the default device); a None
    stays None."""

    def place(array: RowArray | None) -> jax.Array | None:
        if array is None or layout is None:
            return None if array is None else jax.numpy.asarray(array)
        return layout.place_batch({"rows": np.asarray(array)}, even=False)["rows"]

    return tuple(place(array) for array in arrays)
