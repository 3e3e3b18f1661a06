"""`zoo bench` end to end on CPU, in-process (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

import zoo.cli
from zoo.bench.report import FIELDS

SMALL = ["--batch", "2", "--seq", "16", "--warmup", "0", "--decode-prompt", "4"]
SMALL += ["--decode-tokens", "4"]


def results(directory):
    (path,) = directory.glob("bench-*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_gpt_tiny_json_rows_and_results_file(tmp_path, capsys):
    argv = ["bench", "--flavor", "gpt", "--preset", "gpt-tiny", "--steps", "3", *SMALL]
    assert zoo.cli.main([*argv, "--json", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    (row,) = [json.loads(line) for line in lines]
    assert list(row) == list(FIELDS)
    assert (row["flavor"], row["preset"], row["batch"], row["seq"]) == ("gpt", "gpt-tiny", 2, 16)
    assert row["tokens_per_s"] > 0 and row["inference_tokens_per_s"] > 0
    assert row["decode_tokens_per_s"] > 0 and row["compile_s"] > 0
    assert row["flops_per_token"] == 6 * 104192 + 12 * 2 * 4 * 16 * 16
    assert row["mfu"] is None and row["mfu_reason"]  # CPU: no peak, and a reason
    assert row["mfu_measured"] is None and row["mfu_measured_reason"] == row["mfu_reason"]
    assert row["train_step_min_s"] <= row["train_step_s"] <= row["train_step_max_s"]
    assert len(row["train_step_round_medians_s"]) == 3  # 3 steps over 5 rounds: one per round
    assert 0 < row["xla_compile_s"] <= row["compile_s"]
    assert row["xla_settings"]["jax_enable_x64"] is False and "XLA_FLAGS" in row["xla_settings"]
    assert row["peer"] is None and row["ratio"] is None
    saved = results(tmp_path)
    assert saved["rows"] == [row]
    meta = saved["meta"]
    assert meta["command"].startswith("zoo bench --flavor gpt --preset gpt-tiny --batch 2")
    assert "--steps 3" in meta["command"] and "--json" in meta["command"]
    assert {"jax", "jaxlib", "equinox"} <= set(meta["versions"])
    assert meta["device"]["platform"] == "cpu" and meta["date"]
    assert meta["git_dirty"] in (True, False, None)
    assert meta["xla_settings"] == row["xla_settings"] and meta["peak_measured"] is None


def test_bad_options_are_clear_errors(tmp_path, capsys):
    argv = ["bench", "--flavor", "gpt", "--preset", "classifier-tiny", "--no-save"]
    assert zoo.cli.main(argv) == 2
    assert "is a classifier" in capsys.readouterr().err
    assert zoo.cli.main(["bench", "--preset", "gpt-tiny", "--seq", "1000", "--no-save"]) == 2
    assert "max_positions" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.hf
@pytest.mark.parametrize(
    ("preset", "peer_model"), [("gpt-tiny", "GPT2LMHeadModel"), ("llama-tiny", "LlamaForCausalLM")]
)
def test_peer_torch_on_tiny_decoders(tmp_path, capsys, preset, peer_model):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["bench", "--preset", preset, "--steps", "2", *SMALL, "--peer", "torch"]
    assert zoo.cli.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "peer tok/s" in out and "ratio" in out
    (row,) = results(tmp_path)["rows"]
    assert row["peer"] == "torch" and row["peer_model"] == peer_model
    assert row["peer_attention"] == "sdpa" and row["peer_params"] == row["params"]
    assert row["peer_tokens_per_s"] > 0 and row["peer_decode_tokens_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["peer_tokens_per_s"])
    assert abs(row["loss"] - row["peer_loss"]) < 0.5  # same data, same init scale: ln(64) ~ 4.16
    assert {"torch", "transformers"} <= set(results(tmp_path)["meta"]["versions"])
