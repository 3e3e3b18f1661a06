"""Checkpoints damaged where a reader cannot tell by parsing: bit flips (checksums), a full disk
reported by safetensors, a `state.json` nested too deep. Each is set aside or told in one line."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import safetensors.numpy
from safetensors import SafetensorError

from tests.train.helpers import lm_batches, params
from zoo.cli import main
from zoo.files import MAX_JSON_DEPTH
from zoo.train import Outputs, list_checkpoints
from zoo.train.checkpoint_folder import CHECKSUMS, STATE_FILE, checksums


def test_a_checkpoint_records_the_sha256_of_its_files(tmp_path, tiny_gpt, lm_trainer):
    lm_trainer.fit(
        tiny_gpt, lm_batches(), steps=2, key=jax.random.key(1), outputs=Outputs(tmp_path)
    )
    folder = tmp_path / "step_00000002"
    state = json.loads((folder / STATE_FILE).read_text())
    names = ("model.safetensors", "optimizer.safetensors")
    assert state[CHECKSUMS] == checksums(folder, names)
    assert sorted(state[CHECKSUMS]) == list(names)


def test_resume_sets_aside_a_checkpoint_whose_weights_changed(tmp_path, tiny_gpt, lm_trainer):
    data, key = lm_batches(), jax.random.key(1)
    full, _ = lm_trainer.fit(tiny_gpt, data, steps=6, key=key, outputs=Outputs(tmp_path / "full"))
    run = tmp_path / "run"
    lm_trainer.fit(tiny_gpt, data, steps=4, key=key, outputs=Outputs(run))
    weights = run / "step_00000004" / "model.safetensors"
    flipped = bytearray(weights.read_bytes())
    flipped[-5] ^= 0x01  # one bit of the last weight: the file still parses
    weights.write_bytes(bytes(flipped))
    with pytest.warns(UserWarning) as warned:
        model, history = lm_trainer.fit(
            tiny_gpt, data, steps=6, key=key, outputs=Outputs(run), resume=True
        )
    assert [str(w.message) for w in warned] == [
        "skipped checkpoint step_00000004: model.safetensors does not match the sha256 "
        "recorded when it was written; moved it to step_00000004.corrupt"
    ]
    assert history.summary["resumed_from"] == 2
    assert [step for step, _ in list_checkpoints(run)] == [2, 4, 6]
    assert jax.tree.all(jax.tree.map(np.array_equal, params(model), params(full)))


def test_a_state_json_nested_too_deep_is_set_aside(tmp_path, tiny_gpt, lm_trainer):
    data, key = lm_batches(), jax.random.key(1)
    lm_trainer.fit(tiny_gpt, data, steps=4, key=key, outputs=Outputs(tmp_path))
    (tmp_path / "step_00000004" / STATE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.warns(UserWarning) as warned:
        _, history = lm_trainer.fit(
            tiny_gpt, data, steps=6, key=key, outputs=Outputs(tmp_path), resume=True
        )
    messages = [str(w.message) for w in warned]
    assert len(messages) == 1, messages
    assert messages[0].startswith("skipped checkpoint step_00000004: state.json is unreadable (")
    assert f"JSON nested deeper than {MAX_JSON_DEPTH} levels" in messages[0]
    assert messages[0].endswith("; moved it to step_00000004.corrupt")
    assert history.summary["resumed_from"] == 2


def test_a_full_disk_told_by_safetensors_is_zoo_s_one_line(tmp_path, monkeypatch, capsys):
    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"\0" * 100)
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)
    out = tmp_path / "run"
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
               "--steps", "4", "--checkpoint-every", "2", "--batch-size", "4",
               "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(command) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"zoo train: [Errno 28] could not write checkpoint {out}/checkpoints/step_00000002 "
        "(No space left on device); the newest intact checkpoint is none. Free some disk "
        "space (or keep fewer checkpoints) and continue with --resume"
    )
    assert list_checkpoints(out / "checkpoints") == []
    assert not (out / "checkpoints" / ".step_00000002.partial").exists()
