"""Rows, the table and the results file."""

from __future__ import annotations

import json

import pytest

from zoo.bench.report import FIELDS, add_ratios, new_row, notes, table, write_results
from zoo.bench.suite import finite


def test_rows_have_every_field_and_refuse_unknown_ones():
    row = new_row(flavor="gpt", preset="gpt-tiny")
    assert list(row) == list(FIELDS)
    assert row["mfu"] is None
    with pytest.raises(KeyError, match="tokens_per_second"):
        new_row(tokens_per_second=1.0)


def test_ratios_are_zoo_over_peer():
    row = add_ratios(new_row(tokens_per_s=300.0, peer_tokens_per_s=200.0))
    assert row["ratio"] == 1.5
    assert row["inference_ratio"] is None  # neither side measured


def test_non_finite_values_become_null():
    assert finite({"loss": float("nan"), "batch": 2}) == {"loss": None, "batch": 2}


def test_table_and_results_file(tmp_path):
    row = new_row(
        flavor="gpt",
        preset="gpt-tiny",
        batch=2,
        seq=16,
        precision="fp32",
        tokens_per_s=12345.0,
        inference_tokens_per_s=2.5e6,
        compile_s=3.21,
        peer="torch",
        peer_tokens_per_s=10000.0,
        ratio=1.2345,
        peak_memory_bytes=3 * 2**29,  # an int, as device.memory_stats() gives it
    )
    text = table([row])
    assert "12.3k" in text and "2.5M" in text and "1.23x" in text and "peer tok/s" in text
    assert "1.50 GiB" in text
    meta = {
        "date": "2026-01-02T03:04:05+00:00",
        "command": "zoo bench",
        "device": {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"},
    }
    path = write_results(tmp_path / "results", [row], meta)
    assert path.name == "bench-20260102T030405-gpu-nvidia-h100-80gb-hbm3.json"
    saved = json.loads(path.read_text())
    assert saved["meta"] == meta and saved["rows"] == [row]


def test_table_shows_both_mfus_the_step_range_and_names_the_peaks():
    row = new_row(
        flavor="gpt",
        preset="gpt2",
        batch=16,
        seq=1024,
        precision="bf16",
        tokens_per_s=450e3,
        train_step_min_s=0.0351,
        train_step_max_s=0.0402,
        mfu=0.389,
        mfu_peak="H100 SXM bf16 dense 989 TFLOP/s (datasheet)",
        mfu_measured=0.481,
        mfu_measured_peak="H100 SXM bf16 dense 800 TFLOP/s (measured)",
        compile_s=30.0,
    )
    lines = table([row]).splitlines()
    assert "step ms min-max" in lines[0] and "MFU meas" in lines[0]
    assert "35.1-40.2" in lines[2] and "38.9%" in lines[2] and "48.1%" in lines[2]
    assert notes([row]) == [
        "MFU: against H100 SXM bf16 dense 989 TFLOP/s (datasheet)",
        "MFU meas: against H100 SXM bf16 dense 800 TFLOP/s (measured)",
    ]
    cpu = new_row(flavor="gpt", preset="gpt-tiny", batch=2, seq=16, precision="fp32")
    cpu.update(compile_s=1.0, mfu_reason="no bf16 peak is tabled for CPUs")
    assert "MFU meas" not in table([cpu]) and "min-max" not in table([cpu])
    assert notes([cpu]) == ["MFU: no bf16 peak is tabled for CPUs"]
