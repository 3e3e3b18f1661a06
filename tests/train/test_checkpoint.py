"""Checkpoints: exact round trip, atomic publication, pruning, refusing a different model."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import zoo
from zoo.serialize import named_arrays
from zoo.train import Trainer, adamw, checkpoint
from zoo.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def state():
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    trainer = Trainer(zoo.tasks.LanguageModeling(), adamw(1e-3, warmup=5))
    opt_state = trainer.init_optimizer(model)
    # Make the optimizer state non-trivial so a round trip has something to get wrong.
    opt_state = jax.tree_util.tree_map(lambda a: a + 1 if a.ndim == 0 else a * 0 + 0.5, opt_state)
    return model, opt_state, trainer


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def test_round_trip_is_exact(tmp_path, state):
    model, opt_state, trainer = state
    key = jax.random.fold_in(jax.random.key(7), 3)
    path = save_checkpoint(tmp_path, step=12, model=model, opt_state=opt_state, key=key)
    assert path.name == "step_00000012"
    skeleton_state = trainer.init_optimizer(model)
    loaded = load_checkpoint(path, model=model, opt_state=skeleton_state)
    assert loaded.step == 12 and loaded.data_position == 12
    for saved, restored in zip(leaves(opt_state), leaves(loaded.opt_state), strict=True):
        assert saved.dtype == restored.dtype and saved.shape == restored.shape
        np.testing.assert_array_equal(saved, restored)
    for name, array in named_arrays(model).items():
        np.testing.assert_array_equal(
            np.asarray(array), np.asarray(named_arrays(loaded.model)[name])
        )
    np.testing.assert_array_equal(jax.random.key_data(loaded.key), jax.random.key_data(key))
    assert loaded.meta["flavor"] == "gpt" and loaded.meta["config"]["d_model"] == 64


def test_crash_while_publishing_keeps_the_previous_checkpoint(tmp_path, state, monkeypatch):
    model, opt_state, trainer = state
    key = jax.random.key(0)
    save_checkpoint(tmp_path, step=1, model=model, opt_state=opt_state, key=key)

    def crash(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        save_checkpoint(tmp_path, step=2, model=model, opt_state=opt_state, key=key)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]  # no half-written leftovers
    loaded = load_checkpoint(
        latest_checkpoint(tmp_path), model=model, opt_state=trainer.init_optimizer(model)
    )
    assert loaded.step == 1


def test_crash_while_writing_arrays_keeps_the_previous_checkpoint(tmp_path, state, monkeypatch):
    model, opt_state, _ = state
    key = jax.random.key(0)
    save_checkpoint(tmp_path, step=1, model=model, opt_state=opt_state, key=key)
    import safetensors.numpy

    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"\x00\x01 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", half_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, step=2, model=model, opt_state=opt_state, key=key)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]


def test_keeps_only_the_newest(tmp_path, state):
    model, opt_state, _ = state
    for step in (2, 4, 6, 8):
        save_checkpoint(
            tmp_path, step=step, model=model, opt_state=opt_state, key=jax.random.key(0), keep=2
        )
    assert [step for step, _ in list_checkpoints(tmp_path)] == [6, 8]
    (tmp_path / "step_00000010").mkdir()  # no state.json: incomplete, ignored
    assert latest_checkpoint(tmp_path).name == "step_00000008"


def test_refuses_a_model_with_another_config(tmp_path, state):
    model, opt_state, trainer = state
    path = save_checkpoint(
        tmp_path, step=1, model=model, opt_state=opt_state, key=jax.random.key(0)
    )
    other = zoo.create("gpt-tiny", key=jax.random.key(0), d_ff=128)
    expected = r"differs .* in \['layers.block.feed_forward.d_ff'\]; resume with the same preset"
    with pytest.raises(ValueError, match=expected):
        load_checkpoint(path, model=other, opt_state=trainer.init_optimizer(other))
    assert checkpoint.checkpoint_name(3) == "step_00000003"
