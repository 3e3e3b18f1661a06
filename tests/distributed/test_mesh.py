"""Meshes from strings: sizes, `-1`, and the errors for sizes and names that do not fit."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import Mesh

from zoo.distributed import AXES, abstract_mesh, as_mesh, make_mesh, mesh_string
from zoo.distributed.mesh import resolve_sizes


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("data=2,fsdp=2,tensor=2", (2, 2, 2)),
        ("fsdp=-1", (1, 8, 1)),
        ("tensor=2, data=-1", (4, 1, 2)),
        ("data=8", (8, 1, 1)),
        ("fsdp=4,data=2", (2, 4, 1)),
    ],
)
def test_sizes_in_axis_order(spec, sizes):
    assert resolve_sizes(spec, 8) == sizes


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("data=3,fsdp=2", "mesh 'data=3,fsdp=2' needs 6 devices but there are 8 cpu devices; "
         "make the sizes multiply to 8, or give one axis -1"),
        ("model=8", "unknown axis 'model'; the axes are data, fsdp, tensor"),
        ("data=3,fsdp=-1", "the other axes take 3 devices, which does not divide the 8 cpu "
         "devices"),
        ("data", "'data' is not AXIS=SIZE; write e.g. data=2,fsdp=-1"),
        ("data=two", "data=two is not a size; give a positive integer, or -1"),
        ("data=0", "data=0 is not a size"),
        ("data=-1,fsdp=-1", "only one axis may be -1"),
        ("data=2,data=4", "axis 'data' is given twice"),
    ],
)  # fmt: skip
def test_bad_meshes_say_what_to_write(spec, message):
    with pytest.raises(ValueError) as raised:
        resolve_sizes(spec, 8, "cpu")
    assert message in str(raised.value)


def test_make_mesh_over_the_devices_there_are():
    mesh = make_mesh("data=-1")
    assert isinstance(mesh, Mesh)
    assert mesh.axis_names == AXES
    assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}
    assert mesh_string(mesh) == f"data={jax.device_count()},fsdp=1,tensor=1"
    with pytest.raises(ValueError, match="needs 64 devices but there are"):
        make_mesh("fsdp=64")


def test_abstract_mesh_plans_without_devices():
    mesh = abstract_mesh("data=2,tensor=-1", 64)
    assert mesh_string(mesh) == "data=2,fsdp=1,tensor=32"


def test_as_mesh_takes_strings_and_meshes_with_known_axes():
    mesh = as_mesh("data=-1")
    assert as_mesh(mesh) is mesh
    foreign = Mesh(mesh.devices.reshape(-1), ("batch",))
    with pytest.raises(ValueError, match=r"the mesh has axes \['batch'\]; the partition rules use"):
        as_mesh(foreign)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh or a string"):
        as_mesh(8)
