"""Runs and exports written by earlier zoo code load and resume bit for bit with today's code.

`tests/fixtures/old_runs/` holds what two earlier commits wrote (the table of `record.py`
beside them): ddc6d28's tiny `zoo train gpt` run and a LoRA run on it; 212512f's same two, a
chat run (word tokenizer, zoo's default chat template), a HF export (`save_hf`: a Llama-shaped
model with a `tokenizer.json` tokenizer and Qwen2.5's chat template) and a chat run initialised
from that export. Each run stopped at step 4. Each commit's `expected.json` records what that
same code produced when it resumed them to step 8 (the logged losses, every tensor of the final
model and of the optimizer state), the logits of the saved models and the export, and how the
chat tokenizers encode a conversation; `record.py` says how. Here today's `zoo train --resume`,
`zoo.load`, `zoo.from_pretrained` and `zoo.data.encode_chat` must give the same numbers. The
resumes run as a user runs them, the command in a fresh process, on the CPU with the XLA options
the record was made with; the saved models load in a fresh process too, where nothing a saved
file names (a tokenizer kind's module) has been imported yet.

Float results are bit for bit where the machine computes as the recorder's did: the same JAX and
the same CPU instructions, which the record's `xla_digest` (a small fixed JAX program) and a CPU
without AVX-512 (as the recorders' were) stand for. Elsewhere they are held to tolerances; token
ids are exact everywhere.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import zoo
from tests.fixtures.old_runs import record as old
from zoo.serialize import named_arrays
from zoo.train.history import RENAMED_FIELDS

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    commit: json.loads((fixtures.folder / "expected.json").read_text(encoding="utf-8"))
    for commit, fixtures in old.COMMITS.items()
}
RTOL, ATOL = 1e-4, 1e-6  # what another JAX or CPU is held to
RUNS = [(commit, name) for commit, fixtures in old.COMMITS.items() for name in fixtures.runs]
EXPORTS = [(commit, name) for commit, fixtures in old.COMMITS.items() for name in fixtures.exports]
CHATS = [(commit, name) for commit, fixtures in old.COMMITS.items() for name in fixtures.chats]


def ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{commit}-{name}" for commit, name in pairs]


def missing(commit: str, name: str) -> list[str]:
    """The modules (jinja2, tokenizers) that loading `name` needs and this environment lacks."""
    needs = old.COMMITS[commit].needs.get(name, ())
    return [module for module in needs if importlib.util.find_spec(module) is None]


def skip_without_needs(commit: str, name: str) -> None:
    if missing(commit, name):
        pytest.skip(f"{commit}/{name} needs {missing(commit, name)}")


def old_env(commit: str) -> dict[str, str]:
    return {**EXPECTED[commit]["env"], "PYTHONPATH": str(ROOT)}


@functools.cache
def loaded_now(commit: str) -> dict:
    """`record.loaded` in a fresh process, on the models whose needs are installed."""
    names = tuple(name for name in old.COMMITS[commit].models if not missing(commit, name))
    return old.loaded_in_fresh_process(commit, old_env(commit), names)


# the records were made on CPUs without AVX-512; XLA vectorizes some reductions of a whole run
# otherwise on one that has it (16 lanes), which the small digest program does not show
RECORDED_WITHOUT = "avx512f"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; none known elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def bit_for_bit(commit: str) -> bool:
    """Whether this machine computes as the recorder's did: its JAX, a CPU without the vector
    instructions the recorder's lacked, and the same digest of a small fixed JAX program (the
    CPU's vector instructions change the last bits too)."""
    expected = EXPECTED[commit]
    return (
        jax.__version__ == expected["jax"]
        and RECORDED_WITHOUT not in cpu_flags()
        and loaded_now(commit)["xla_digest"] == expected["xla_digest"]
    )


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """`(commit, name) -> resumed run`: the commit's fixtures copied to a scratch folder of the
    run's own and the run resumed there by its recorded command (once; a failure is kept)."""
    done: dict[tuple[str, str], dict | BaseException] = {}

    def resumed(commit: str, name: str) -> dict:
        skip_without_needs(commit, name)
        if (commit, name) not in done:
            scratch = tmp_path_factory.mktemp(f"old_{commit}_{name}")
            try:
                runs = old.resume_all(old.COMMITS[commit], EXPECTED[commit]["commands"], scratch,
                                      old_env(commit), names=(name,))  # fmt: skip
                done[commit, name] = runs[name]
            except (AssertionError, OSError, subprocess.SubprocessError) as error:
                done[commit, name] = error
        found = done[commit, name]
        if isinstance(found, BaseException):
            raise found
        return found

    return resumed


def assert_same_weights(commit: str, name: str, got: dict) -> None:
    expected = EXPECTED[commit]
    want = expected["resumed"][name]
    for part in ("model", "optimizer"):
        assert sorted(got[part]) == sorted(want[part]), f"{part}: tensor names differ"
        if bit_for_bit(commit):
            differ = [tensor for tensor in want[part] if got[part][tensor] != want[part][tensor]]
            assert differ == [], f"{part}: tensors not bit for bit the recorded ones"
        else:
            near = expected["summaries"][name][part]
            differ = [
                tensor
                for tensor in near
                if not np.allclose(got["summaries"][part][tensor], near[tensor], RTOL, ATOL)
            ]
            assert differ == [], f"{part}: tensor sums differ from the recorded ones"


def assert_same_losses(commit: str, name: str, got: dict) -> None:
    want = EXPECTED[commit]["resumed"][name]["metrics"]
    assert len(got["metrics"]) == len(want)
    # the fields the record kept (a later zoo may log more)
    # under the names the recorder logged them by (`trained_tokens`, today's `scored`)
    rows = [{field: row.get(RENAMED_FIELDS.get(field, field)) for field in kept}
            for row, kept in zip(got["metrics"], want)]  # fmt: skip
    if bit_for_bit(commit):
        assert rows == want
        return

    def exact(rows: list[dict]) -> list[dict]:  # step, split, lr and token counts
        return [{k: v for k, v in row.items() if k not in ("loss", "metric")} for row in rows]

    assert exact(rows) == exact(want)
    for row, expected in zip(rows, want, strict=True):
        assert row["loss"] == pytest.approx(expected["loss"], rel=RTOL)
        assert row["metric"] == pytest.approx(expected["metric"], rel=RTOL)


@pytest.mark.parametrize("commit", list(old.COMMITS))
def test_each_record_names_its_code_jax_and_machine_and_keeps_what_others_are_held_to(commit):
    expected = EXPECTED[commit]
    fixtures = old.COMMITS[commit]
    assert expected["written_by"] == commit and expected["jax"] and expected["xla_digest"]
    assert expected["commands"] == old.commands(fixtures)  # record.py still says how
    assert (expected["first_steps"], expected["resumed_steps"]) == (old.FIRST_STEPS,
                                                                    old.RESUMED_STEPS)  # fmt: skip
    assert expected["logits_tokens"] == old.LOGITS_TOKENS
    assert sorted(expected["resumed"]) == sorted(fixtures.runs)
    for name in fixtures.runs:
        for part in ("model", "optimizer"):
            assert sorted(expected["summaries"][name][part]) == sorted(
                expected["resumed"][name][part]
            )
    assert sorted(expected["logits"]) == sorted(fixtures.models)
    for name in fixtures.models:
        assert np.asarray(expected["logits"][name]).shape[0] == len(old.LOGITS_TOKENS)
    assert sorted(expected.get("chat", {})) == sorted(fixtures.chats)


@pytest.mark.slow
@pytest.mark.parametrize(("commit", "name"), RUNS, ids=ids(RUNS))
def test_an_old_run_resumes_to_the_same_weights(resumed_runs, commit, name):
    # LoRA runs: the adapters and their optimizer state
    assert_same_weights(commit, name, resumed_runs(commit, name))


@pytest.mark.slow
@pytest.mark.parametrize(("commit", "name"), RUNS, ids=ids(RUNS))
def test_an_old_run_resumes_to_the_same_losses(resumed_runs, commit, name):
    assert_same_losses(commit, name, resumed_runs(commit, name))


@pytest.mark.parametrize(("commit", "name"), RUNS, ids=ids(RUNS))
def test_old_saved_models_load_weights_bit_for_bit(commit, name):
    folder = old.COMMITS[commit].folder / name
    model = zoo.load(folder)
    assert zoo.lora.has_lora(model) == (name == "lora")
    assert model.config.layer_loop == "auto"  # ddc6d28 saved it as scan_layers=true
    saved = load_file(str(folder / "model.safetensors"))
    loaded = {path: np.asarray(array) for path, array in named_arrays(model).items()}
    assert sorted(loaded) == sorted(saved)
    assert all(np.array_equal(loaded[path], saved[path]) for path in saved)


@pytest.mark.parametrize(("commit", "name"), EXPORTS, ids=ids(EXPORTS))
def test_an_old_export_loads_its_weights_bit_for_bit(commit, name):
    folder = old.COMMITS[commit].folder / name
    model = zoo.from_pretrained(folder)
    arrays, _ = zoo.interop.to_state_dict(model, full=False)  # the export's own names again
    saved = load_file(str(folder / "model.safetensors"))
    assert sorted(arrays) == sorted(saved)
    assert all(np.array_equal(np.asarray(arrays[key]), saved[key]) for key in saved)


@pytest.mark.slow
@pytest.mark.parametrize("commit", list(old.COMMITS))
def test_old_saved_models_and_exports_give_the_recorded_logits(commit):
    expected, got = EXPECTED[commit], loaded_now(commit)
    assert sorted(got["logits"]) == sorted(
        name for name in old.COMMITS[commit].models if not missing(commit, name)
    )
    for name, values in got["logits"].items():
        if bit_for_bit(commit):
            assert got["logits_sha256"][name] == expected["logits_sha256"][name], name
        np.testing.assert_allclose(values, expected["logits"][name], RTOL, ATOL, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(("commit", "name"), CHATS, ids=ids(CHATS))
def test_old_chat_tokenizers_encode_a_conversation_as_they_did(commit, name):
    # the saved tokenizer (its kind, special ids) and chat template: token ids are exact anywhere
    skip_without_needs(commit, name)
    assert EXPECTED[commit]["conversation"] == old.CONVERSATION
    assert loaded_now(commit)["chat"][name] == EXPECTED[commit]["chat"][name]
