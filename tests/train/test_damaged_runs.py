"""Runs damaged by crashes and full disks: resume from what is intact, clear errors, no temps."""

from __future__ import annotations

import errno
import json
import os

import jax
import numpy as np
import pytest
import safetensors.numpy

import zoo
from tests.train.helpers import lm_batches
from zoo.cli import main
from zoo.train import Outputs, list_checkpoints


def test_resume_skips_a_truncated_checkpoint_and_a_half_written_metrics_line(
    tmp_path, tiny_gpt, lm_trainer
):
    data, key = lm_batches(), jax.random.key(1)
    _, full = lm_trainer.fit(tiny_gpt, data, steps=6, key=key, outputs=Outputs(tmp_path / "full"))
    run = tmp_path / "run"
    lm_trainer.fit(tiny_gpt, data, steps=4, key=key, outputs=Outputs(run))
    weights = run / "step_00000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy or a sync cut short
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 5, "spl')  # a crash in the middle of a row
    with pytest.warns(UserWarning) as warned:
        _, history = lm_trainer.fit(
            tiny_gpt, data, steps=6, key=key, outputs=Outputs(run), resume=True
        )
    messages = [str(w.message) for w in warned]
    assert any(
        m.startswith("skipped checkpoint step_00000004: model.safetensors is unreadable (")
        and m.endswith("); moved it to step_00000004.corrupt")
        for m in messages
    ), messages
    assert any('dropped the half-written last line 5 (\'{"step": 5, "spl\')' in m for m in messages)
    assert history.summary["resumed_from"] == 2
    assert [step for step, _ in list_checkpoints(run)] == [2, 4, 6]
    assert (run / "step_00000004.corrupt" / "model.safetensors").stat().st_size == 1000
    # The redone steps equal the uninterrupted run's, and the log has each step once.
    np.testing.assert_allclose(history.losses(), full.losses(), rtol=0, atol=1e-6)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_resume_refuses_when_no_checkpoint_is_intact(tmp_path, tiny_gpt, lm_trainer):
    lm_trainer.fit(
        tiny_gpt, lm_batches(), steps=2, key=jax.random.key(1), outputs=Outputs(tmp_path)
    )
    (tmp_path / "step_00000002" / "state.json").write_text('{"step": 2, "ke')
    with (
        pytest.warns(UserWarning, match="skipped checkpoint step_00000002: state.json is"),
        pytest.raises(ValueError, match=r"no intact checkpoint in .*; start a new run"),
    ):
        lm_trainer.fit(tiny_gpt, lm_batches(), steps=4, key=jax.random.key(1),
                    outputs=Outputs(tmp_path), resume=True)  # fmt: skip


def disk_full(monkeypatch):
    """safetensors writes half of a file, then the disk is full."""

    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)


def hidden_files(folder):
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob(".*") if p.name != ".zoo-train.lock"
    )


def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_temp_files(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    disk_full(monkeypatch)
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
               "--steps", "4", "--checkpoint-every", "2", "--batch-size", "4",
               "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(command) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"zoo train: [Errno 28] could not write checkpoint {out}/checkpoints/step_00000002 "
        "(No space left on device); the newest intact checkpoint is none. Free some disk "
        "space (or keep fewer checkpoints) and continue with --resume"
    )
    assert hidden_files(out) == []
    assert list_checkpoints(out / "checkpoints") == []


def test_a_full_disk_while_saving_a_model_leaves_no_temp_file(tmp_path, tiny_gpt, monkeypatch):
    disk_full(monkeypatch)
    with pytest.raises(OSError, match=r"could not save the model to .* \(No space left on dev"):
        zoo.save(tiny_gpt, tmp_path)
    assert hidden_files(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
