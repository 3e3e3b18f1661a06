"""What a benchmark ran on: the device, its dense bf16 peak, its memory, the library versions."""

from __future__ import annotations

import enum
import importlib.metadata
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import jax

from zoo.files import JSONObject

# Dense (no sparsity) bf16 tensor peak per device, in TFLOP/s, from the vendors' datasheets.
# Matched in order against the lower-cased `device.device_kind`; the first match wins, so the
# variants (PCIe, NVL) come before the plain name. Add a row to get MFU on another device.
PEAK_BF16_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"h100.*pcie", "H100 PCIe", 756.0),
    (r"h100.*nvl", "H100 NVL", 835.0),
    (r"gh200", "GH200", 989.0),
    (r"h200", "H200", 989.0),
    (r"h100", "H100 SXM", 989.0),
    (r"b200", "B200", 2250.0),
    (r"a100", "A100", 312.0),
    (r"l40s", "L40S", 362.0),
    (r"\bl4\b", "L4", 121.0),
    (r"\ba10\b", "A10", 125.0),
    (r"tpu v4", "TPU v4", 275.0),
    (r"tpu v5 ?lite|tpu v5e", "TPU v5e", 197.0),
    (r"tpu v5p?$", "TPU v5p", 459.0),
    (r"tpu v6", "TPU v6e", 918.0),
)


# Dense bf16 peaks measured on a device (an 8192^3 bf16 matmul), keyed by the datasheet table's
# name. Real devices reach 80-85% of the datasheet; MFU against both is reported.
MEASURED_BF16_TFLOPS: dict[str, tuple[float, str]] = {
    "H100 SXM": (800.0, "measured: 8192^3 bf16 matmul on the project's H100, ../shared/GPU.md"),
}


@dataclass(frozen=True)
class Peak:
    """The dense bf16 peak of a device, or why there is none."""

    tflops: float | None  # TFLOP/s; None when the device is not in the table
    name: str | None  # the table's name for the device
    reason: str | None  # why `tflops` is None (None when it is known)
    source: str = "datasheet"  # where `tflops` comes from: the datasheet or a measurement

    @property
    def label(self) -> str | None:
        """The table entry, e.g. "H100 SXM bf16 dense 989 TFLOP/s (datasheet)"; None if unknown."""
        if self.tflops is None:
            return None
        return f"{self.name} bf16 dense {self.tflops:g} TFLOP/s ({self.source})"


def peak_bf16(device_kind: str, platform_name: str) -> Peak:
    """Look up the dense bf16 peak of a device by its `device_kind` (see `PEAK_BF16_TFLOPS`)."""
    if platform_name == "cpu":
        return Peak(None, None, "no bf16 peak is tabled for CPUs: MFU is reported on GPU/TPU")
    kind = device_kind.lower().strip()
    for pattern, name, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, kind):
            return Peak(tflops, name, None)
    return Peak(
        None,
        None,
        f"device kind {device_kind!r} is not in zoo.bench.hardware.PEAK_BF16_TFLOPS; "
        "add its dense bf16 peak there to get MFU",
    )


def measured_peak_bf16(device_kind: str, platform_name: str) -> Peak:
    """The measured dense bf16 peak of a device (see `MEASURED_BF16_TFLOPS`), or why there is none."""
    datasheet = peak_bf16(device_kind, platform_name)
    if datasheet.name is None:
        return datasheet
    if datasheet.name not in MEASURED_BF16_TFLOPS:
        return Peak(
            None,
            None,
            f"no measured bf16 peak for {datasheet.name} in "
            "zoo.bench.hardware.MEASURED_BF16_TFLOPS; mfu uses the datasheet",
        )
    tflops, source = MEASURED_BF16_TFLOPS[datasheet.name]
    return Peak(tflops, datasheet.name, None, source=source)


def mfu(flops_per_step: int | float, step_seconds: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense bf16 peak."""
    if peak.tflops is None:
        return None
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds}")
    return flops_per_step / step_seconds / (peak.tflops * 1e12)


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), else `platform.processor()`."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def device_info(device: jax.Device | None = None) -> dict:
    """Name, kind and platform of `device` (default: the first device JAX sees)."""
    device = jax.devices()[0] if device is None else device
    name = device.device_kind
    cores = usable_cores()
    if device.platform == "cpu":
        name = f"{cpu_name()} ({cores} of {os.cpu_count()} cores)"
    return {
        "device": name,
        "device_kind": device.device_kind,
        "platform": device.platform,
        "device_count": jax.device_count(),
        "cpu_cores": cores,
    }


def usable_cores() -> int:
    """CPU cores this process may run on (`taskset` and cgroups narrow them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def peak_memory(device: jax.Device | None = None) -> tuple[int | None, str | None]:
    """(peak bytes in use since the process started, None) or (None, why it is unknown)."""
    device = jax.devices()[0] if device is None else device
    stats = device.memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None, f"device.memory_stats() reports no peak on {device.platform}"
    return int(stats["peak_bytes_in_use"]), None


def versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of python and the given distributions (None if not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


# Environment variables that change what XLA compiles or how JAX holds device memory.
XLA_ENVIRONMENT = (
    "XLA_FLAGS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "JAX_PLATFORMS",
    "TF_CPP_MIN_LOG_LEVEL",
)
# JAX settings that change the compiled program or its numerics.
JAX_SETTINGS = (
    "jax_default_matmul_precision",
    "jax_enable_x64",
    "jax_numpy_dtype_promotion",
    "jax_compilation_cache_dir",
    "jax_default_prng_impl",
)


def xla_settings() -> JSONObject:
    """The XLA environment variables (None where unset) and JAX settings in force."""
    found: JSONObject = {name: os.environ.get(name) for name in XLA_ENVIRONMENT}
    for name in JAX_SETTINGS:
        value = getattr(jax.config, name, None)
        # enums (dtype promotion) are written as their value, so the row stays plain JSON
        if isinstance(value, enum.Enum):
            value = str(value.value)
        found[name] = value
    return found


ZOO_PACKAGES = ("jax", "jaxlib", "equinox", "optax", "numpy")
PEER_PACKAGES = ("torch", "transformers")
