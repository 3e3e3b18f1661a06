"""JAX's persistent compilation cache: a rerun of the same shapes loads its compiled steps.

XLA compiles a train step once per process; the persistent cache keeps the compiled program on
disk, keyed by the program, the compiler options and the device, so the next process that
builds the same step (a rerun, `--resume`, `zoo eval` of the same model) reads it back instead.
On SmolLM2-135M's LoRA step that is the difference between seconds and tens of seconds of
start-up on a CPU (docs/training.md).

`zoo train` turns it on by default in `default_directory()` (`$ZOO_COMPILE_CACHE`, else
`$XDG_CACHE_HOME/zoo/compile`, else `~/.cache/zoo/compile`); `--compile-cache DIR` chooses the
folder and `--compile-cache none` (or `ZOO_COMPILE_CACHE=none`) turns it off.

JAX caches only programs that took at least `jax_persistent_cache_min_compile_time_secs` to
compile (1 s by default) and are at least `jax_persistent_cache_min_entry_size_bytes` large.
`MIN_COMPILE_SECONDS` lowers the first to 0.2 s: the train and eval steps of even a small
model (0.3 to 1 s on a CPU) are kept, while the hundreds of tiny programs of start-up (random
initialisation, slicing), each compiled in milliseconds, are not written to disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV_VAR = "ZOO_COMPILE_CACHE"
OFF = "none"
MIN_COMPILE_SECONDS = 0.2  # programs that compile faster than this are not written
MIN_ENTRY_BYTES = 0  # every size of program is written

_enabled: Path | None = None


def default_directory() -> str:
    """`$ZOO_COMPILE_CACHE`, else the user's cache folder's `zoo/compile`."""
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zoo", "compile")


def enable_compile_cache(directory: str | os.PathLike[str] | None) -> Path | None:
    """Write and read compiled programs in `directory` (None or "none": leave the cache off).

    Returns the folder in use. Once a process has compiled through the cache, JAX keeps the
    folder it opened first: a different folder asked for later raises, so that a run does not
    believe it writes where it does not.
    """
    global _enabled
    if directory is None or str(directory).strip().lower() == OFF:
        return None
    folder = Path(directory).expanduser().resolve()
    if _enabled is not None:
        if folder != _enabled:
            raise ValueError(
                f"--compile-cache {folder}: this process already caches compiled programs in "
                f"{_enabled}; use that folder, or run in a new process"
            )
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"--compile-cache {directory}: cannot create the folder ({error.strerror}); give a "
            f"writable folder or 'none' to turn the cache off"
        ) from None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # a threshold the user set for JAX itself wins over zoo's
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_BYTES)
    _enabled = folder
    return folder


def cache_entries(directory: str | os.PathLike[str]) -> int:
    """How many compiled programs `directory` holds (JAX writes one `NAME-KEY-cache` file per
    program, beside an `-atime` file of its last use)."""
    folder = Path(directory)
    if not folder.is_dir():
        return 0
    return sum(1 for path in folder.iterdir() if path.name.endswith("-cache"))
