"""The bench path runs without `datasets` and `beartype` (the GPU machine has neither), and a
missing optional package is a one-line error, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo.cli

ROOT = Path(__file__).resolve().parents[2]

# Blocks the imports the way a missing package would, then runs the CLI as the GPU script does.
BLOCKED = """
import sys
sys.modules["datasets"] = None
sys.modules["beartype"] = None
import zoo.cli
argv = sys.argv[1:]
code = zoo.cli.main(argv)
assert "datasets" not in sys.modules or sys.modules["datasets"] is None
sys.exit(code)
"""


def run_blocked(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_bench_and_presets_run_without_datasets_and_beartype():
    small = ["--batch", "2", "--seq", "16", "--warmup", "0", "--rounds", "1"]
    small += ["--decode-prompt", "4", "--decode-tokens", "4"]
    done = run_blocked(
        "bench", "--preset", "gpt-tiny", "--steps", "2", *small, "--json", "--no-save"
    )
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["preset"] == "gpt-tiny" and row["tokens_per_s"] > 0 and row["steps"] == 2
    listed = run_blocked("presets", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "gpt2" in [json.loads(line)["name"] for line in listed.stdout.splitlines()]


def test_missing_torch_for_the_peer_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert zoo.cli.main(["bench", "--preset", "gpt-tiny", "--peer", "torch", "--no-save"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zoo bench: error: --peer torch needs torch and transformers")
    assert (
        err.endswith("install them with pip install 'jax-transformer-zoo[bench]'")
        and "\n" not in err
    )


def test_missing_matplotlib_stops_zoo_train_plot_before_training(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition"]
    argv += ["--steps", "1", "--plot", "--out", str(tmp_path / "run")]
    assert zoo.cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "zoo train: error: plotting training curves needs matplotlib: pip install 'jax-transformer-zoo[plot]'"
    )
    assert not (tmp_path / "run").exists()  # nothing was trained
