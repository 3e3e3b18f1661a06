"""Where arrays live on a mesh: the model and optimizer state by the rules, batches by rows.

A `Layout` (a mesh and its rules) is what the trainer and generation hold: `place` puts a
pytree's arrays onto their shardings (`jax.device_put`), `constrain` pins them inside a jitted
function (`jax.lax.with_sharding_constraint`), and `place_batch` makes each batch array one
global array whose rows are split over the `data` and `fsdp` axes
(`jax.make_array_from_process_local_data`: each process hands over only its own rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import equinox as eqx
import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec
from jaxtyping import ArrayLike, PyTree

from zoo.distributed.mesh import BATCH_AXES, as_mesh, axis_size, mesh_string
from zoo.distributed.rules import RULES, Rule, shardings

Tree = TypeVar("Tree")  # a pytree placed: the same structure, its arrays moved


@dataclass(frozen=True)
class Layout:
    """A mesh and the partition rules that place arrays on it (hashable: steps are cached by it)."""

    mesh: Mesh | AbstractMesh  # abstract: enough to plan shardings and check batches
    rules: tuple[Rule, ...] = RULES

    @classmethod
    def of(
        cls, mesh: Mesh | str, rules: Iterable[tuple[str, Sequence[str | None]]] | None = None
    ) -> Layout:
        """`mesh` (a `Mesh` or a string like `data=2,fsdp=-1`) with `rules` (default `RULES`)."""
        table = RULES if rules is None else tuple((str(p), tuple(s)) for p, s in rules)
        return cls(as_mesh(mesh), table)

    @property
    def batch_ways(self) -> int:
        """How many slices the batch's rows are split into (data x fsdp)."""
        return math.prod(axis_size(self.mesh, name) for name in BATCH_AXES)

    def shardings(self, tree: PyTree) -> PyTree:
        """The `NamedSharding` of each array of `tree` (see `zoo.distributed.shardings`)."""
        return shardings(tree, self.mesh, self.rules)

    def place(self, tree: Tree) -> Tree:
        """`tree` with its arrays copied onto their shardings (the input is left as it was)."""
        arrays, static = eqx.partition(tree, eqx.is_array)
        # through host memory: device_put from one device to a sharding compiles a program per
        # array shape, while host arrays are sliced into shards without compiling anything
        placed = jax.device_put(jax.device_get(arrays), self.shardings(arrays))
        return eqx.combine(placed, static)

    def constrain(self, tree: Tree) -> Tree:
        """Inside `jit`: `tree` with its arrays pinned to their shardings."""
        arrays, static = eqx.partition(tree, eqx.is_array)
        pinned = jax.lax.with_sharding_constraint(arrays, self.shardings(arrays))
        return eqx.combine(pinned, static)

    def check_batch(self, batch: Mapping[str, ArrayLike]) -> None:
        """The batch's rows must split evenly over the data and fsdp axes."""
        size = _rows(batch)
        if size % self.batch_ways:
            raise ValueError(
                f"batch size {size} does not split over the mesh {mesh_string(self.mesh)}: "
                f"its data x fsdp axes take {self.batch_ways} slices of rows; choose a batch "
                f"size that is a multiple of {self.batch_ways}"
            )

    def batch_sharding(self, ndim: int, split: bool = True) -> NamedSharding:
        """Rows over (data, fsdp), every other dimension whole (`split=False`: all whole)."""
        rows = tuple(a for a in BATCH_AXES if a in self.mesh.axis_names) if split else None
        return NamedSharding(self.mesh, PartitionSpec(rows, *([None] * (ndim - 1))))

    def place_batch(
        self, batch: Mapping[str, ArrayLike], *, even: bool = True
    ) -> dict[str, jax.Array]:
        """Each array of `batch` (the global batch, the same on every process) as one global
        array split by rows; a process hands over only the rows its devices hold.

        Rows that do not split evenly raise ValueError, or with `even=False` (evaluation's
        last, smaller batch) the batch is copied whole to every device instead. Inside a
        traced program (a step lowered as a whole) the rows are constrained to the sharding."""
        split = True
        if even:
            self.check_batch(batch)
        else:
            split = _rows(batch) % self.batch_ways == 0
        placed = {}
        for name, value in batch.items():
            sharding = self.batch_sharding(np.ndim(value), split)
            if isinstance(value, jax.core.Tracer):  # inside a traced program: a constraint
                placed[name] = jax.lax.with_sharding_constraint(value, sharding)
                continue
            if isinstance(value, jax.Array) and value.sharding == sharding:
                placed[name] = value
                continue
            value = np.asarray(value)
            indices = sharding.addressable_devices_indices_map(value.shape).values()
            rows = [slice(None) if index is None else index[0] for index in indices]
            start = min(row.start or 0 for row in rows)
            stop = max(len(value) if row.stop is None else row.stop for row in rows)
            placed[name] = jax.make_array_from_process_local_data(
                sharding, value[start:stop], value.shape
            )
        return placed


def _rows(batch: Mapping[str, ArrayLike]) -> int:
    """The rows of a batch: the length of the first axis of its first array."""
    shape = np.shape(next(iter(batch.values())))
    if not shape:
        raise ValueError("a batch's arrays have the batch axis first; this one holds a scalar")
    return shape[0]
