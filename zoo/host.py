"""Host memory settings that make XLA's CPU backend fast: keep freed memory for the next step.

XLA on a CPU allocates a step's temporary buffers with `malloc` and frees them when the step
ends. glibc hands large freed blocks back to the kernel, so the next step touches brand-new
pages and pays a page fault for every 4 KiB of them. On the small presets that was a third of a
training step (`classifier-small`, 16 x 64, one core: 59 ms -> 36 ms; `translator-small`: 1010
-> 703 ms; see docs/benchmarks.md). Asking glibc to keep a pad of memory at the top of its
heap (`mallopt(M_TOP_PAD)`) lets each step reuse the pages the previous one touched.

`tune_host_allocator()` is called by the `zoo` command line and by `zoo.Trainer` on a CPU. It
changes a process-wide setting, so it is explicit and can be turned off: set the environment
variable `ZOO_MALLOC_TOP_PAD_MB=0` (or another size in MiB). It does nothing off Linux/glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV_VAR = "ZOO_MALLOC_TOP_PAD_MB"
DEFAULT_TOP_PAD_MB = 1024
# glibc's mallopt parameter numbers
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_INT_MAX = 2**31 - 1

_applied: int | None = None


def requested_top_pad_mb() -> int:
    """The pad asked for: `$ZOO_MALLOC_TOP_PAD_MB`, else 1024 MiB."""
    value = os.environ.get(ENV_VAR)
    if value is None or value.strip() == "":
        return DEFAULT_TOP_PAD_MB
    try:
        megabytes = int(value)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR} must be a whole number of MiB (0 turns the setting off), got {value!r}"
        ) from None
    if megabytes < 0:
        raise ValueError(f"{ENV_VAR} must be >= 0, got {megabytes}")
    return megabytes


def tune_host_allocator() -> int | None:
    """Set glibc's `M_TOP_PAD` once per process; returns the pad in MiB, or None if unchanged.

    None when the variable asks for 0, when the C library is not glibc, or when `mallopt`
    refuses. Calling it again is free and returns the same answer.
    """
    global _applied
    if _applied is not None:
        return _applied or None
    megabytes = requested_top_pad_mb()
    _applied = 0
    if megabytes == 0 or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    pad = min(megabytes << 20, _INT_MAX)
    settings = (
        (_M_MMAP_THRESHOLD, pad),
        (_M_TRIM_THRESHOLD, min(2 * pad, _INT_MAX)),
        (_M_TOP_PAD, pad),
    )
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        accepted = [libc.mallopt(option, ctypes.c_int(value)) for option, value in settings]
    except (OSError, AttributeError):
        return None
    if accepted != [1, 1, 1]:
        return None
    _applied = megabytes
    return megabytes


def allocator_note() -> str:
    """One line for benchmark records: what this process's allocator setting is."""
    if _applied:
        return f"glibc malloc with M_TOP_PAD = {_applied} MiB (zoo.host.tune_host_allocator)"
    return "system default malloc settings"
