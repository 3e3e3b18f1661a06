"""`benchmarks/gpu.sh --dry-run`: the GPU suite rehearsed on the CPU with tiny rows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.data.shared_paths import SHARED_DATA, needs_shared_data
from zoo.bench.report import new_row

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def run_script(*argv: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, "ZOO_GPU_TESTS": "0", **env}
    environment.pop("PYTHONPATH", None)  # the script sets its own: the checkout first
    return subprocess.run(
        ["bash", str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=240,
        env=environment,
        cwd="/",  # the script finds the checkout from its own path
    )


def steps(results: Path) -> dict[str, tuple[str, str]]:
    rows = [line.split("\t") for line in (results / "steps.tsv").read_text().splitlines()]
    return {name: (status, note) for name, status, _, note in rows}


@pytest.mark.slow
def test_dry_run_writes_rows_logs_failures_and_ends_with_the_table(tmp_path):
    rows = (
        "gpt-tiny 2 16 --profile PROFILE;no-such-preset 2 16;gpt-tiny 2 999 --peer torch;"
        "nanogpt 2 16"
    )
    archive = tmp_path / "back" / "gpu.tar.gz"
    done = run_script("--dry-run", "--archive", str(archive), str(tmp_path / "gpu"),
                      ZOO_GPU_PRESETS=rows)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(archive) as packed:
        archived = packed.getnames()
    tmp_path = tmp_path / "gpu"
    found = steps(tmp_path)
    assert found["environment"][0] == found["presets"][0] == "ok"
    assert found["bench-gpt-tiny-2x16"] == ("ok", "")
    assert found["bench-no-such-preset-2x16"] == (
        "skipped",
        "preset no-such-preset is not in zoo presets",
    )
    # a failing row is logged with its error, and retried without the peer, and the run goes on
    status, note = found["bench-gpt-tiny-2x999"]
    assert status == "failed" and note.startswith("exit 2: zoo bench: error: seq=999 exceeds")
    assert found["bench-gpt-tiny-2x999-alone"][0] == "failed"
    assert "pytest-gpu" not in found  # ZOO_GPU_TESTS=0
    # nanoGPT's bench.py needs CUDA: on this CPU its row says why it did not run
    assert found["nanogpt-2x16"][0] == "skipped" and "nanoGPT" in found["nanogpt-2x16"][1]

    (results_file,) = tmp_path.glob("bench-*-cpu.json")
    (row,) = json.loads(results_file.read_text())["rows"]
    assert (row["preset"], row["batch"], row["seq"], row["precision"]) == (
        "gpt-tiny",
        2,
        16,
        "bf16",
    )
    assert row["steps"] == 2 and len(row["train_step_round_medians_s"]) == 2
    assert row["decode_tokens_per_s"] > 0 and row["peer"] is None
    environment = json.loads((tmp_path / "environment.json").read_text())
    assert environment["device"]["platform"] == "cpu" and environment["versions"]["jax"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"] == 1 and len(summary["targets"]) == 8
    assert {target["met"] for target in summary["targets"]} == {None}  # no GPU rows here
    assert "gpt-tiny" in (tmp_path / "logs" / "bench-gpt-tiny-2x16.log").read_text()
    # the row's profile (its own call, zoo alone), its line in the closing table, and one
    # archive of it all
    assert row["profile"] is None
    assert found["profile-gpt-tiny-2x16"] == ("ok", "")
    profile = json.loads((tmp_path / "profile" / "gpt-tiny-2x16-bf16.profile.json").read_text())
    (profiled,) = json.loads(next((tmp_path / "profile").glob("bench-*.json")).read_text())["rows"]
    assert profiled["profile"] == str(tmp_path / "profile" / "gpt-tiny-2x16-bf16.profile.json")
    assert profiled["steps"] == 3 and profiled["decode_tokens_per_s"] is None
    assert summary["profiles"][0].startswith(
        f"gpt-tiny 2x16: wall {profile['wall_ms_per_step']:,.3g}"
    )
    assert {"gpu/summary.json", "gpu/steps.tsv", "gpu/logs/bench-gpt-tiny-2x16.log",
            "gpu/profile/gpt-tiny-2x16-bf16.profile.json",
            "gpu/profile/gpt-tiny-2x16-bf16.trace.json.gz"} <= set(archived)  # fmt: skip
    assert (tmp_path / "profile" / "gpt-tiny-2x16-bf16.xplane.pb").exists()
    assert not [name for name in archived if name.endswith(".xplane.pb")]

    # the table comes last: the steps, the targets, then the rows
    tail = done.stdout.rsplit("\nsteps:\n", 1)[1]
    assert "bench-gpt-tiny-2x999-alone" in tail and "gpt2 16x1024 train tokens/s" in tail
    table = tail.split("1 bench row(s) from")[1].splitlines()
    assert "train tok/s" in table[1] and "gpt-tiny" in table[3] and "2x16" in table[3]
    assert (
        done.stdout.rstrip()
        .splitlines()[-1]
        .endswith(f"results in {tmp_path}, packed in {archive}")
    )


@pytest.mark.slow
@needs_shared_data
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (zoo[bench])")
def test_the_finetune_row_runs_zoo_and_trl_on_random_weights(tmp_path):
    data = str(SHARED_DATA / "rotten_tomatoes")
    rows = "finetune 2 128 --random-preset llama-tiny --steps 2"
    done = run_script("--dry-run", str(tmp_path / "gpu"), ZOO_GPU_PRESETS=rows, ZOO_GPU_DATA=data)
    assert done.returncode == 0, done.stdout + done.stderr
    results = tmp_path / "gpu"
    found = steps(results)
    assert found["finetune-2x128"] == ("ok", "")
    (path,) = results.glob("finetune_peer-*-cpu.json")
    measured = json.loads(path.read_text())
    assert (measured["meta"]["weights"], measured["meta"]["precision"]) == (
        "random llama-tiny", "fp32"
    )  # fmt: skip
    for side in ("zoo", "trl"):
        assert measured[side]["seconds_per_step"] > 0 and measured[side]["peak_rss_mb"] > 0
        assert measured[side]["median_seconds_per_step"] > 0
        assert measured[side]["device_peak_mb"] is None  # a CPU reports no device peak
    summary = json.loads((results / "summary.json").read_text())
    assert summary["finetune"][0].startswith("2x128 fp32, random llama-tiny: s/step zoo")
    assert ", median zoo " in summary["finetune"][0]


def test_every_step_is_skipped_when_the_budget_is_spent(tmp_path):
    done = run_script("--dry-run", str(tmp_path), ZOO_GPU_BUDGET_S="20", ZOO_GPU_TESTS="1")
    assert done.returncode == 0, done.stderr
    found = steps(tmp_path)
    assert set(found) >= {"environment", "pytest-gpu", "presets", "bench-gpt-tiny-4x32"}
    assert {status for status, _ in found.values()} == {"skipped"}
    assert found["bench-llama-tiny-4x32"] == ("skipped", "out of time (budget 20 s)")
    assert "0 bench row(s)" in done.stdout


def test_usage_errors(tmp_path):
    done = run_script()
    assert done.returncode == 2
    assert "usage: benchmarks/gpu.sh [--dry-run] [--archive FILE.tar.gz] RESULTS_DIR" in done.stderr
    done = run_script("--fast", str(tmp_path))
    assert done.returncode == 2 and "unknown option --fast" in done.stderr
    done = run_script(str(tmp_path), "--archive")
    assert done.returncode == 2 and "--archive needs a file name" in done.stderr


def load_gpu_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def h100_row(preset, batch, seq, **values):
    row = new_row(preset=preset, batch=batch, seq=seq, precision="bf16", params=124_439_808)
    row.update(device="NVIDIA H100 80GB HBM3", peer_mode="compiled", **values)
    return row


def test_targets_are_judged_from_the_rows():
    gpu_suite = load_gpu_suite()
    rows = [
        h100_row(
            "gpt2",
            16,
            1024,
            tokens_per_s=460e3,
            ratio=1.3,
            compile_s=75.0,
            mfu=0.398,
            mfu_peak="H100 SXM bf16 dense 989 TFLOP/s (datasheet)",
            peer_params=124_439_808,
        ),
        # BERT's pooler: 0.5% more parameters is still the same model
        h100_row("bert-base", 32, 512, ratio=1.1, peer_params=125_030_400),
        h100_row("smollm2-135m", 16, 1024, ratio=1.25, peer_params=124_439_808),
        # a peer of another size: its ratio does not count
        h100_row("transformer-base", 32, 128, ratio=2.0, peer_params=1_000),
        h100_row("gpt2", 1, 128, decode_tokens_per_s=5000.0),
    ]
    for path, tokens, temp in (("ragged", 60e3, 3 * 2**30), ("dense", 20e3, 9 * 2**30)):
        moe = dict(moe_path=path, tokens_per_s=tokens, ratio=tokens / 40e3, train_temp_bytes=temp)
        rows.append(h100_row("olmoe-1b-7b", 8, 1024, peer_params=124_439_808, **moe))
    found = {t["target"]: t for t in gpu_suite.targets(rows, {(16, 1024): 400e3})}
    moe = found["olmoe 2-layer ragged train / peer"]  # 60k / 40k: the ragged row's ratio
    assert moe["value"] == pytest.approx(1.5) and moe["met"] is True
    assert moe["note"] == "peer compiled; 3.00x the dense path; temporaries 3.0/9.0 GiB"
    assert found["gpt2 16x1024 train tokens/s"]["met"] is False  # 460k < 490k
    versus = found["gpt2 16x1024 train / nanoGPT"]  # 460k / 400k = 1.15x >= 1.1x
    assert versus["value"] == pytest.approx(1.15) and versus["met"] is True
    assert versus["note"] == "nanoGPT 400,000 tok/s"
    assert found["bert-base train / peer"]["met"] is False
    assert found["smollm2-135m train / peer"]["met"] is True
    mismatch = found["transformer-base train / peer"]
    assert mismatch["met"] is None and "peer has 1,000 parameters" in mismatch["note"]
    assert mismatch["goal"] == ">= 2.0x"
    assert gpu_suite.targets(rows)[1]["note"] == "no nanoGPT row"
    # floor: 3.35e12 B/s / (124,439,808 x 2 B) = 13,460 tokens/s; within 3x: >= 4,487
    decode = found["gpt2 batch-1 decode tokens/s"]
    assert decode["goal"] == ">= 4,487" and decode["met"] is True
    assert "floor 13,460 tok/s" in decode["note"]
    assert found["gpt2 train step compile s"]["met"] is False  # 75 s > 60 s
    (warning,) = gpu_suite.peer_warnings(rows)
    assert warning.startswith("transformer-base 32x128: the peer (None) has 1,000 parameters")


def test_nanogpt_tokens_per_second_come_from_its_log(tmp_path):
    gpu_suite = load_gpu_suite()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "nanogpt-16x1024.log").write_text(
        "Compiling model...\n19/20 loss: 10.9\ntime per iteration: 36.9000ms, MFU: 39.20%\n"
    )
    (logs / "nanogpt-8x512.log").write_text("Traceback ...\nRuntimeError: no CUDA\n")
    found = gpu_suite.read_nanogpt(tmp_path)
    assert found == {(16, 1024): pytest.approx(16 * 1024 / 0.0369)}  # 444,011 tokens/s
