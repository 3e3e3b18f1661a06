"""Trace and lower a zoo program for CUDA on a machine without a GPU.

`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` builds the StableHLO a GPU would
compile, on any host. Three private names make that possible and are pinned here; when JAX or
Equinox moves one, `lowering_unavailable()` says which (tests skip with that reason):

- `jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version` and
  `check_compute_capability`: JAX asks them before emitting a cuDNN attention call; patched
  to say "cuDNN 9.10 on a Hopper GPU".
- `equinox._errors.EQX_ON_ERROR`: `eqx.error_if` (zoo's token-id and cache checks under jit)
  becomes a host callback, which only the platform that runs the program can lower; set to
  "off" while lowering.

`zoo.nn.kernel_platform("gpu")` makes zoo choose its attention kernels as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax

from zoo.nn import kernel_platform

CUDNN_VERSION = 91000  # what the patched check reports: cuDNN 9.10


def lowering_unavailable() -> str | None:
    """Why a CUDA program cannot be lowered here (a private name moved), or None."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused
    except ImportError as error:
        return f"jax._src.cudnn.fused_attention_stablehlo is gone ({error}); update the pins"
    for name in ("check_cudnn_version", "check_compute_capability"):
        if not callable(getattr(fused, name, None)):
            return f"jax moved fused_attention_stablehlo.{name}; update the pins in cuda_program.py"
    try:
        from equinox import _errors
    except ImportError as error:
        return f"equinox._errors is gone ({error}); update the pins in cuda_program.py"
    if not hasattr(_errors, "EQX_ON_ERROR"):
        return "equinox moved _errors.EQX_ON_ERROR; update the pins in cuda_program.py"
    return None


@contextlib.contextmanager
def as_if_on_a_gpu() -> Iterator[None]:
    """Patch the pinned names: cuDNN 9.10 on a Hopper GPU, no host callbacks, zoo's GPU
    kernel choice, and JAX's standard dtype promotion (its attention mixes bf16 and f32).

    JAX's trace caches do not know of these patches: a module that uses this context starts
    and ends with `separate_traces` (a function traced earlier in the process with host
    callbacks, for the CPU kernels, must not be lowered for CUDA, nor a CUDA trace run later on
    the CPU)."""
    from equinox import _errors
    from jax._src.cudnn import fused_attention_stablehlo as fused

    saved = (fused.check_cudnn_version, fused.check_compute_capability, _errors.EQX_ON_ERROR)
    fused.check_cudnn_version = lambda *args, **kwargs: CUDNN_VERSION
    fused.check_compute_capability = lambda *args, **kwargs: True
    _errors.EQX_ON_ERROR = "off"
    try:
        with kernel_platform("gpu"), jax.numpy_dtype_promotion("standard"):
            yield
    finally:
        fused.check_cudnn_version, fused.check_compute_capability, _errors.EQX_ON_ERROR = saved


@contextlib.contextmanager
def separate_traces() -> Iterator[None]:
    """Empty JAX's caches on the way in and out (once per test module: emptying them makes
    every later call compile again)."""
    jax.clear_caches()
    try:
        yield
    finally:
        jax.clear_caches()


def _traced(leaf: Any) -> bool:
    return eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def cuda_text(function: Callable[..., Any], *args: Any) -> str:
    """The StableHLO of `function(*args)` lowered for CUDA. Arrays in `args`, and shapes
    (`jax.ShapeDtypeStruct`, e.g. a model from `eqx.filter_eval_shape`: nothing allocated),
    are traced."""
    dynamic, static = eqx.partition(args, _traced)

    def program(dynamic):
        return eqx.filter(function(*eqx.combine(dynamic, static)), eqx.is_array)

    with as_if_on_a_gpu():
        return jax.jit(program).trace(dynamic).lower(lowering_platforms=("cuda",)).as_text()
