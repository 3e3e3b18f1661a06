"""The dense bf16 peak table, MFU arithmetic and device facts."""

from __future__ import annotations

import pytest

from zoo.bench.hardware import (
    Peak,
    device_info,
    measured_peak_bf16,
    mfu,
    peak_bf16,
    peak_memory,
    versions,
    xla_settings,
)


@pytest.mark.parametrize(
    ("kind", "name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA H200", "H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA L4", "L4", 121.0),
        ("NVIDIA L40S", "L40S", 362.0),
        ("TPU v5 lite", "TPU v5e", 197.0),
        ("TPU v4", "TPU v4", 275.0),
    ],
)
def test_known_devices(kind, name, tflops):
    peak = peak_bf16(kind, "gpu" if "NVIDIA" in kind else "tpu")
    assert (peak.name, peak.tflops, peak.reason) == (name, tflops, None)


def test_unknown_device_and_cpu_have_no_peak_and_say_why():
    unknown = peak_bf16("Imaginary Accelerator 9000", "gpu")
    assert unknown.tflops is None
    assert "Imaginary Accelerator 9000" in unknown.reason
    assert "PEAK_BF16_TFLOPS" in unknown.reason
    cpu = peak_bf16("cpu", "cpu")
    assert cpu.tflops is None and "CPU" in cpu.reason


def test_mfu_arithmetic():
    h100 = Peak(989.0, "H100 SXM", None)
    # half of the peak: 494.5e12 FLOPs in one second
    assert mfu(494.5e12, 1.0, h100) == pytest.approx(0.5)
    # gpt2 at 450k tokens/s: 855,166,464 FLOPs per token -> 3.848e14 FLOP/s -> 38.9%
    step_s = 16 * 1024 / 450_000
    assert mfu(16 * 1024 * 855_166_464, step_s, h100) == pytest.approx(0.3891, abs=1e-4)
    assert mfu(1e12, 1.0, Peak(None, None, "unknown")) is None
    with pytest.raises(ValueError, match="step_seconds"):
        mfu(1e12, 0.0, h100)


def test_this_machine():
    info = device_info()
    assert set(info) == {"device", "device_kind", "platform", "device_count", "cpu_cores"}
    memory, reason = peak_memory()
    assert (memory is None) != (reason is None)
    found = versions("jax", "not-a-package-zoo-knows")
    assert found["jax"] and found["not-a-package-zoo-knows"] is None


def test_peaks_are_named_with_their_source():
    datasheet = peak_bf16("NVIDIA H100 80GB HBM3", "gpu")
    assert datasheet.label == "H100 SXM bf16 dense 989 TFLOP/s (datasheet)"
    measured = measured_peak_bf16("NVIDIA H100 80GB HBM3", "gpu")
    assert (measured.tflops, measured.name, measured.reason) == (800.0, "H100 SXM", None)
    assert measured.label.startswith("H100 SXM bf16 dense 800 TFLOP/s (measured: 8192^3")
    # gpt2 at 450k tokens/s: 3.848e14 FLOP/s is 38.9% of the datasheet, 48.1% of the measured
    flops = 450_000 * 855_166_464
    assert mfu(flops, 1.0, measured) == pytest.approx(0.4810, abs=1e-4)
    h200 = measured_peak_bf16("NVIDIA H200", "gpu")
    assert h200.tflops is None and h200.label is None
    assert "no measured bf16 peak for H200" in h200.reason and "datasheet" in h200.reason
    assert measured_peak_bf16("cpu", "cpu").reason == peak_bf16("cpu", "cpu").reason


def test_xla_settings_read_the_environment_and_jax_config(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    settings = xla_settings()
    assert settings["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler=true"
    assert settings["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None
    assert settings["jax_enable_x64"] is False
    assert settings["jax_numpy_dtype_promotion"] == "strict"  # tests/conftest.py sets it
