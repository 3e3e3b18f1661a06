"""The layout's checks that need no forced devices: batch rows, the orbax extra, one device."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest

import zoo
from zoo.distributed import Layout, abstract_mesh


def test_batch_rows_must_split_over_data_and_fsdp():
    layout = Layout(abstract_mesh("data=2,fsdp=2,tensor=2", 8))
    assert layout.batch_ways == 4
    layout.check_batch({"tokens": np.zeros((8, 3), np.int32)})
    with pytest.raises(ValueError) as raised:
        layout.check_batch({"tokens": np.zeros((6, 3), np.int32)})
    assert str(raised.value) == (
        "batch size 6 does not split over the mesh data=2,fsdp=2,tensor=2: its data x fsdp "
        "axes take 4 slices of rows; choose a batch size that is a multiple of 4"
    )
    # before: TypeError: object of type 'numpy.int32' has no len()
    with pytest.raises(ValueError, match="batch axis first; this one holds a scalar"):
        layout.check_batch({"step": np.int32(3)})


def test_place_batch_on_one_device_mesh():
    layout = Layout.of("data=-1")
    placed = layout.place_batch({"tokens": np.arange(6, dtype=np.int32).reshape(2, 3)})
    assert placed["tokens"].sharding == layout.batch_sharding(2)
    np.testing.assert_array_equal(placed["tokens"], np.arange(6).reshape(2, 3))


def test_a_mesh_without_orbax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "orbax", None)
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[distributed\]'"):
        zoo.Trainer(zoo.tasks.LanguageModeling(), mesh="data=-1")
    assert zoo.Trainer(zoo.tasks.LanguageModeling()).layout is None  # no mesh: no orbax needed
    assert jax.device_count() >= 1


def test_bench_takes_a_mesh_but_not_with_the_peer(capsys):
    from zoo.bench.workload import BenchSpec
    from zoo.cli import main

    assert BenchSpec(preset="gpt-tiny", batch=8, seq=16, mesh="fsdp=-1").mesh == "fsdp=-1"
    with pytest.raises(ValueError, match="unknown axis 'model'"):
        BenchSpec(preset="gpt-tiny", batch=8, seq=16, mesh="model=2")
    assert main(["bench", "--preset", "gpt-tiny", "--mesh", "data=1", "--peer", "torch"]) == 2
    assert "--peer runs on one device: drop --mesh or --peer" in capsys.readouterr().err
