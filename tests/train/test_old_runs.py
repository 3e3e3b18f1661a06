"""Run directories written by an earlier zoo load and resume bit for bit with today's code.

`tests/fixtures/old_runs/` holds a tiny `zoo train gpt` run and a LoRA run on it, both written
by the code of commit ddc6d28 and stopped at step 4 with checkpoints at steps 2 and 4.
`expected.json` records what that same code produced when it resumed them to step 8 (the
logged losses, every tensor of the final model and of the optimizer state) and the logits of
the saved models; `record.py` beside it says how. Here today's `zoo train --resume` and
`zoo.load` must give the same numbers, bit for bit. The resumes run as a user runs them, the
command in a fresh process, on the CPU with the XLA options the record was made with.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import zoo
from tests.fixtures.old_runs.record import LOGITS_TOKENS, resumed, summaries
from zoo.serialize import named_arrays

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "old_runs"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
# bit for bit under the recording's JAX; within these tolerances under any other
RECORDED_JAX = jax.__version__ == EXPECTED["jax"]
RTOL, ATOL = 1e-4, 1e-6


def run_old_env(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **EXPECTED["env"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def resume(name: str, folder: Path) -> Path:
    """Copy both fixture runs into `folder`, run the recorded `--resume` command of `name` and
    return its run directory."""
    for run in ("gpt", "lora"):
        shutil.copytree(FIXTURES / run, folder / run)
    words = shlex.split(EXPECTED["commands"][f"{name}_resume"])
    assert words[0] == "zoo"
    run_old_env([sys.executable, "-m", "zoo", *words[1:]], folder)
    return folder / name


@pytest.fixture(scope="module")
def resumed_gpt(tmp_path_factory) -> dict:
    run = resume("gpt", tmp_path_factory.mktemp("old_gpt"))
    return {**resumed(run), "summaries": summaries(run)}


@pytest.fixture(scope="module")
def resumed_lora(tmp_path_factory) -> dict:
    run = resume("lora", tmp_path_factory.mktemp("old_lora"))
    return {**resumed(run), "summaries": summaries(run)}


def assert_same_weights(name: str, got: dict) -> None:
    want = EXPECTED["resumed"][name]
    for part in ("model", "optimizer"):
        assert sorted(got[part]) == sorted(want[part]), f"{part}: tensor names differ"
        if RECORDED_JAX:
            differ = [tensor for tensor in want[part] if got[part][tensor] != want[part][tensor]]
            assert differ == [], f"{part}: tensors not bit for bit the recorded ones"
        else:
            near = EXPECTED["summaries"][name][part]
            differ = [
                tensor
                for tensor in near
                if not np.allclose(got["summaries"][part][tensor], near[tensor], RTOL, ATOL)
            ]
            assert differ == [], f"{part}: tensor sums differ from the recorded ones"


def assert_same_losses(name: str, got: dict) -> None:
    want = EXPECTED["resumed"][name]["metrics"]
    if RECORDED_JAX:
        assert got["metrics"] == want
    else:
        assert [(row["step"], row["split"], row["lr"]) for row in got["metrics"]] == [
            (row["step"], row["split"], row["lr"]) for row in want
        ]
        for row, expected in zip(got["metrics"], want, strict=True):
            assert row["loss"] == pytest.approx(expected["loss"], rel=RTOL)
            assert row["metric"] == pytest.approx(expected["metric"], rel=RTOL)


def test_the_record_names_its_jax_and_keeps_what_other_versions_are_held_to():
    assert EXPECTED["jax"] and EXPECTED["written_by"] == "ddc6d28"
    for name in ("gpt", "lora"):
        for part in ("model", "optimizer"):
            assert sorted(EXPECTED["summaries"][name][part]) == sorted(
                EXPECTED["resumed"][name][part]
            )
        assert np.asarray(EXPECTED["logits"][name]).shape[0] == len(LOGITS_TOKENS)


@pytest.mark.slow
def test_an_old_run_resumes_to_the_same_weights(resumed_gpt):
    assert_same_weights("gpt", resumed_gpt)


@pytest.mark.slow
def test_an_old_run_resumes_to_the_same_losses(resumed_gpt):
    assert_same_losses("gpt", resumed_gpt)


@pytest.mark.slow
def test_an_old_lora_run_resumes_to_the_same_weights(resumed_lora):
    assert_same_weights("lora", resumed_lora)  # adapters and their optimizer state


@pytest.mark.slow
def test_an_old_lora_run_resumes_to_the_same_losses(resumed_lora):
    assert_same_losses("lora", resumed_lora)


@pytest.mark.parametrize("name", ["gpt", "lora"])
def test_old_saved_models_load_weights_bit_for_bit(name):
    model = zoo.load(FIXTURES / name)
    assert zoo.lora.has_lora(model) == (name == "lora")
    assert model.config.layer_loop == "auto"  # saved as scan_layers=true
    saved = load_file(str(FIXTURES / name / "model.safetensors"))
    loaded = {path: np.asarray(array) for path, array in named_arrays(model).items()}
    assert sorted(loaded) == sorted(saved)
    assert all(np.array_equal(loaded[path], saved[path]) for path in saved)


@pytest.mark.slow
def test_old_saved_models_give_the_recorded_logits(tmp_path):
    program = (
        "import json, sys; from tests.fixtures.old_runs.record import logits, logits_digest; "
        "print(json.dumps({n: [logits_digest(sys.argv[1] + '/' + n), "
        "logits(sys.argv[1] + '/' + n).tolist()] for n in ('gpt', 'lora')}))"
    )
    done = run_old_env([sys.executable, "-c", program, str(FIXTURES)], ROOT)
    assert EXPECTED["logits_tokens"] == LOGITS_TOKENS
    got = json.loads(done.stdout.splitlines()[-1])
    if RECORDED_JAX:
        assert {name: digest for name, (digest, _) in got.items()} == EXPECTED["logits_sha256"]
    for name, (_, values) in got.items():
        np.testing.assert_allclose(values, EXPECTED["logits"][name], RTOL, ATOL)
