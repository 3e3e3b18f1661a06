"""Test-wide settings: strict dtype promotion, no implicit rank promotion, shared-data paths,
and on a CPU-only machine XLA's backend optimisations off."""

from __future__ import annotations

import gc
import os
import shutil

import jax
import pytest

from tests.data.shared_paths import SHARED_TIKTOKEN


def _cpu_only() -> bool:
    platforms = os.environ.get("JAX_PLATFORMS", "")
    return platforms in ("", "cpu") and shutil.which("nvidia-smi") is None


# The tests' programs are tiny: compiling them is most of the suite's time, and XLA's CPU
# backend optimisations (LLVM passes) take a third of it; results agree within the tests'
# tolerances either way. XLA reads the flag when JAX starts its backend (the first
# computation, not the import); the CLI tests' subprocesses inherit it.
if _cpu_only() and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()


jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))

# `zoo train` run in-process would open the user's persistent compilation cache for the whole
# test process; tests of the cache give their own folder (tests/train/test_compile_cache.py)
os.environ.setdefault("ZOO_COMPILE_CACHE", "none")


# XLA's CPU compiler maps memory for each program it compiles and keeps it while JAX caches the
# program: a test worker running hundreds of tests passes the kernel's limit on mappings per
# process (vm.max_map_count, 65530 by default) and its next compile crashes (SIGSEGV). Past
# this many mappings, JAX's compiled programs are dropped between test modules.
MAPPINGS_BEFORE_CLEARING = 30_000


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    if _mappings() > MAPPINGS_BEFORE_CLEARING:
        jax.clear_caches()
        gc.collect()


@pytest.fixture
def key():
    return jax.random.key(0)
