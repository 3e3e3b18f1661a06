"""Mesh checkpoints written in the background: invisible to resume and `keep` until complete,
waited for by the next save and the end of the run, failures reported, not lost.

On one device (a `data=1` mesh) with orbax's real writer, its wait held back by an event; the
8-device case (shards, donated buffers) is in forced/test_background_save.py.
"""

from __future__ import annotations

import errno
import threading

import jax
import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")

import zoo
from zoo.data.batches import ArrayBatches
from zoo.distributed import Layout
from zoo.train import Outputs
from zoo.train.checkpoint import list_checkpoints, load_checkpoint
from zoo.train.pending import CheckpointWriteFailed, PendingWrite
from zoo.train.sharded import ShardedWriter

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def placed():
    layout = Layout.of("data=1")
    model = layout.place(zoo.create("gpt-tiny", key=jax.random.key(0)))
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), mesh=layout.mesh)
    return layout, model, trainer.init_optimizer(model)


def held_writer(directory, monkeypatch, **options):
    """A ShardedWriter whose background wait for orbax blocks until `release.set()`."""
    writer = ShardedWriter(directory, **options)
    release = threading.Event()
    real = writer._wait_for_arrays

    def held():
        release.wait(timeout=60)
        real()

    monkeypatch.setattr(writer, "_wait_for_arrays", held)
    return writer, release


def save(writer, step, placed):
    _, model, opt_state = placed
    return writer.save(step=step, model=model, opt_state=opt_state, key=jax.random.key(step))


def test_a_checkpoint_counts_only_once_written(tmp_path, placed, monkeypatch):
    writer, release = held_writer(tmp_path, monkeypatch, keep=1)
    first = save(writer, 1, placed)
    assert not first.exists()
    release.set()
    assert writer.wait_published() == first
    assert [p for _, p in list_checkpoints(tmp_path)] == [first]
    release.clear()
    second = save(writer, 2, placed)
    assert second.name == "step_00000002" and not second.exists()
    assert [p for _, p in list_checkpoints(tmp_path)] == [first]  # keep=1: not yet pruned
    assert (tmp_path / ".step_00000002.partial" / "state.json").is_file()  # hidden meanwhile
    release.set()
    assert writer.wait_published() == second
    assert [p for _, p in list_checkpoints(tmp_path)] == [second]
    assert not (tmp_path / ".step_00000002.partial").exists()
    layout, model, opt_state = placed
    loaded = load_checkpoint(second, model=model, opt_state=opt_state, layout=layout)
    np.testing.assert_array_equal(loaded.model.embedder.token_weight, model.embedder.token_weight)
    writer.close()


def test_a_relative_directory_is_written_and_read_back(tmp_path, placed, monkeypatch):
    """`zoo train --out run` gives a relative path; orbax itself takes absolute ones only."""
    monkeypatch.chdir(tmp_path)
    with ShardedWriter("checkpoints", keep=2) as writer:
        path = save(writer, 3, placed)
    assert path == tmp_path / "checkpoints" / "step_00000003" and path.is_dir()
    layout, model, opt_state = placed
    relative = path.relative_to(tmp_path)
    loaded = load_checkpoint(relative, model=model, opt_state=opt_state, layout=layout)
    np.testing.assert_array_equal(loaded.model.embedder.token_weight, model.embedder.token_weight)


def test_a_failed_background_write_is_reported_and_not_published(tmp_path, placed, monkeypatch):
    writer = ShardedWriter(tmp_path, keep=3)
    save(writer, 1, placed)
    writer.wait_published()

    real = writer._wait_for_arrays

    def full_disk():  # orbax's threads end, reporting a failure
        real()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "_wait_for_arrays", full_disk)
    save(writer, 2, placed)  # returns: the failure happens in the background
    with pytest.raises(CheckpointWriteFailed, match=r"checkpoint .*step_00000002 could not be "
                       r"written in the background \(OSError: could not write checkpoint .*No "
                       r"space left on device.*the checkpoints before it are kept. Fix the "
                       r"cause"):  # fmt: skip
        save(writer, 3, placed)  # the next save waits for it first
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]
    assert not (tmp_path / ".step_00000002.partial").exists()
    writer.close()


def test_pending_write_reports_an_error_raised_in_its_thread(tmp_path):
    started = threading.Event()

    def finish():
        started.set()
        raise ValueError("arrays/ vanished")

    pending = PendingWrite(tmp_path / "step_00000007", finish)
    started.wait(timeout=10)
    with pytest.raises(CheckpointWriteFailed, match="step_00000007 could not be written in the "
                       r"background \(ValueError: arrays/ vanished\)"):  # fmt: skip
        pending.wait()
    assert pending.done


@pytest.mark.slow
def test_training_reports_a_failed_background_save(tmp_path, monkeypatch):
    def failing(self, staging, final):
        if final.name == "step_00000002":
            raise OSError(errno.EIO, "I/O error")
        return original(self, staging, final)

    original = ShardedWriter._finish
    monkeypatch.setattr(ShardedWriter, "_finish", failing)
    loop = zoo.train.LoopSettings(log_every=1, checkpoint_every=1, progress=False)
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), loop=loop, mesh="data=1")
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    with pytest.raises(CheckpointWriteFailed, match="step_00000002 could not be written"):
        tokens = np.random.default_rng(0).integers(3, 60, (32, 12)).astype(np.int32)
        batches = ArrayBatches({"tokens": tokens}, 8, seed=0)
        trainer.fit(model, batches, steps=4, key=jax.random.key(1), outputs=Outputs(tmp_path))
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]  # reported at step 3's save
