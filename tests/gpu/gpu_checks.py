"""Marks of the GPU suite (`pytest -m gpu`, run by benchmarks/gpu.sh): what only a GPU can check.

Tests marked `gpu` belong to the suite. The ones that need a GPU skip without one; the checks
that also mean something on the CPU (KV-cache agreement, no recompilation while decoding) run
there too, in the normal suite. `ZOO_GPU_TESTS_ON_CPU=1` also runs the GPU-only checks that do
not need cuDNN (the bf16 training run) on the CPU, to rehearse them.
"""

from __future__ import annotations

import os

import jax
import pytest

ON_GPU = jax.default_backend() == "gpu"
REHEARSE = os.environ.get("ZOO_GPU_TESTS_ON_CPU") == "1"

requires_gpu = pytest.mark.skipif(
    not (ON_GPU or REHEARSE),
    reason=f"needs a GPU (JAX runs on {jax.default_backend()}); "
    "ZOO_GPU_TESTS_ON_CPU=1 rehearses it on the CPU",
)
requires_cudnn = pytest.mark.skipif(
    not ON_GPU, reason=f"cuDNN attention needs an NVIDIA GPU (JAX runs on {jax.default_backend()})"
)
