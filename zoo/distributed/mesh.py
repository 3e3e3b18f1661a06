"""A device mesh from a string: `data=2,fsdp=2,tensor=2`.

The mesh has three named axes, always in this order (an axis left out has size 1), and a
fourth, `expert`, where the spec names it:

- `data`: copies of the model, each training on its own rows of the batch (data parallel)
- `fsdp`: rows of the batch too, and a slice of every parameter and optimizer array each
  (fully sharded data parallel, ZeRO-3 style)
- `expert`: rows of the batch too, and a slice of a mixture of experts' experts each (expert
  parallel); it sits between `fsdp` and `tensor`
- `tensor`: a slice of the attention heads and the feed-forward width each (Megatron style)

The sizes multiply to the number of devices; `-1` on one axis takes the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh

AXES = ("data", "fsdp", "tensor")
# every axis a mesh may have: AXES, and `expert` where a spec names it
ALL_AXES = ("data", "fsdp", "expert", "tensor")
# the axes that split the batch's rows (those the mesh has)
BATCH_AXES = ("data", "fsdp", "expert")
EXAMPLE = "data=2,fsdp=-1"


def parse_mesh(spec: str) -> dict[str, int]:
    """`"data=2,fsdp=-1"` -> `{"data": 2, "fsdp": -1}` (sizes not yet resolved)."""
    sizes: dict[str, int] = {}
    for item in spec.split(","):
        name, separator, value = (part.strip() for part in item.partition("="))
        if not separator or not name:
            raise ValueError(
                f"mesh {spec!r}: {item.strip()!r} is not AXIS=SIZE; write e.g. {EXAMPLE} "
                f"(axes: {', '.join(ALL_AXES)})"
            )
        if name not in ALL_AXES:
            raise ValueError(
                f"mesh {spec!r}: unknown axis {name!r}; the axes are {', '.join(AXES)} "
                "(and expert, splitting a mixture of experts' experts) "
                f"(e.g. {EXAMPLE})"
            )
        if name in sizes:
            raise ValueError(f"mesh {spec!r}: axis {name!r} is given twice; give it once")
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1 and size != -1:
            raise ValueError(
                f"mesh {spec!r}: {name}={value} is not a size; give a positive integer, or -1 "
                "on one axis to take the devices left"
            )
        sizes[name] = size
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"mesh {spec!r}: only one axis may be -1 (it takes the devices left)")
    return sizes


def resolve_sizes(
    spec: str, device_count: int, platform: str = "device", processes: int = 1
) -> tuple[int, ...]:
    """The size of each of `mesh_axes(spec)` for `spec` on `device_count` devices (of
    `processes`)."""
    where = (
        "" if processes == 1 else f" ({device_count // processes} on each of {processes} processes)"
    )
    sizes = parse_mesh(spec)
    known = math.prod(size for size in sizes.values() if size != -1)
    for name, size in sizes.items():
        if size == -1:
            if device_count % known:
                raise ValueError(
                    f"mesh {spec!r}: the other axes take {known} devices, which does not divide "
                    f"the {device_count} {platform} devices; choose sizes that divide "
                    f"{device_count}"
                )
            sizes[name] = device_count // known
    total = math.prod(sizes.values())
    if total != device_count:
        raise ValueError(
            f"mesh {spec!r} needs {total} devices but there are {device_count} {platform} "
            f"devices{where}; make the sizes multiply to {device_count}, or give one axis -1 to take "
            f"the rest (e.g. {EXAMPLE})"
        )
    return tuple(sizes.get(name, 1) for name in mesh_axes(spec))


def mesh_axes(spec: str) -> tuple[str, ...]:
    """The axis names of the mesh `spec` describes: `AXES`, with `expert` if it names it."""
    return ALL_AXES if "expert" in parse_mesh(spec) else AXES


def make_mesh(spec: str, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The `Mesh` with axes `AXES` that `spec` describes, over `devices` (default: all)."""
    devices = list(jax.devices() if devices is None else devices)
    processes = len({device.process_index for device in devices})
    platform = devices[0].platform if devices else "device"
    shape = resolve_sizes(spec, len(devices), platform, processes)
    from jax.experimental import mesh_utils

    try:  # an arrangement that keeps the inner axes on nearby chips (TPU, NVLink)
        grid = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, mesh_axes(spec))


def abstract_mesh(spec: str, device_count: int) -> AbstractMesh:
    """The mesh `spec` describes on `device_count` devices, without the devices: enough to plan
    shardings (`describe`, `sharding_table`) for hardware this machine does not have."""
    return AbstractMesh(resolve_sizes(spec, device_count), mesh_axes(spec))


def as_mesh(mesh: object) -> Mesh:
    """A `Mesh` as it is (its axis names must be among `AXES`), or one made from a string
    (anything else is a `TypeError`)."""
    if isinstance(mesh, str):
        return make_mesh(mesh)
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh or a string like {EXAMPLE!r}, "
            f"got {type(mesh).__name__}"
        )
    unknown = [name for name in mesh.axis_names if name not in ALL_AXES]
    if unknown:
        raise ValueError(
            f"the mesh has axes {list(mesh.axis_names)}; the partition rules use "
            f"{', '.join(ALL_AXES)}: name the mesh's axes among those"
        )
    return mesh


def axis_size(mesh: Mesh | AbstractMesh, name: str) -> int:
    """The size of axis `name` in `mesh` (1 when the mesh has no such axis)."""
    return int(dict(mesh.shape).get(name, 1))


def mesh_string(mesh: Mesh | AbstractMesh) -> str:
    """`data=2,fsdp=2,tensor=2`: the sizes of `mesh` as `parse_mesh` reads them."""
    return ",".join(f"{name}={size}" for name, size in mesh.shape.items())
