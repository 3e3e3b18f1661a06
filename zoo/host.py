"""Host memory settings that make XLA's CPU backend fast: keep freed memory for the next step.

XLA on a CPU allocates a step's temporary buffers with `malloc` and frees them when the step
ends. glibc hands large freed blocks back to the kernel, so the next step touches brand-new
pages and pays a page fault for every 4 KiB of them. Asking glibc (`mallopt`) to serve blocks
up to 1 GiB from its heap, to keep up to 2 GiB of free memory before trimming, and to keep a
1 GiB pad at the top lets each step reuse the pages the previous one touched. On one CPU core
at batch 16 x 64 (`zoo bench`, docs/benchmarks.md) that took `translator-tiny` from 28.1k to
50.1k train tokens/s and `gpt-small` from 9.5k to 12.8k.

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
    """The size asked for, in MiB: `$ZOO_MALLOC_TOP_PAD_MB`, else 1024."""
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
    """Set glibc's mmap threshold, trim threshold and top pad once per process.

    Returns the size in MiB, or None if nothing was changed.

    Nothing is changed when the variable asks for 0, when the C library is not glibc, or when
    `mallopt` refuses. Calling it again is free and returns the same answer.
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
        return (
            f"glibc malloc tuned by zoo.host: top pad and mmap threshold {_applied} MiB, "
            f"trim threshold {2 * _applied} MiB"
        )
    return "system default malloc settings"
