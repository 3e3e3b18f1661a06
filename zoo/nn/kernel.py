"""Which attention kernel a call runs: zoo's explicit softmax, XLA's fused attention or cuDNN's.

`zoo.nn.attention.dot_product_attention` asks `choose_kernel` once per traced call. The choice
is made while tracing, from what is known then: the platform the program is for, dtypes, head
size, whether the mask can be said in lengths and flags, attention dropout, a score bias.

- `"explicit"`: zoo's own float32 softmax of einsum scores. Needed for attention dropout and
  for returning the weights; the default on the CPU, where its backward pass is faster.
- `"xla"`: `jax.nn.dot_product_attention(implementation="xla")`.
- `"cudnn"`: cuDNN's fused flash attention on an NVIDIA GPU, the default there for bf16/fp16.
  Where cuDNN cannot serve a call (float32, a head size it lacks, a mask that is not lengths,
  causal order and a window), the call runs XLA's attention instead and the reason is logged
  once: asking for cuDNN never crashes a model.

`kernel_platform("gpu")` makes the choice as if on a GPU while tracing on another machine
(lowering a program for CUDA on a CPU host: `jax.jit(f).trace(...).lower(lowering_platforms=
("cuda",))`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Literal

import jax
import jax.numpy as jnp

from zoo.nn.mask import KernelArguments

Kernel = Literal["explicit", "xla", "cudnn"]
IMPLEMENTATIONS = (None, "explicit", "xla", "cudnn")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)

logger = logging.getLogger("zoo.nn")
_platform_override: list[str] = []
_said: set[str] = set()


@contextlib.contextmanager
def kernel_platform(platform: str) -> Iterator[None]:
    """Choose attention kernels as if tracing for `platform` ("cpu" or "gpu")."""
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"kernel_platform takes 'cpu' or 'gpu', got {platform!r}")
    _platform_override.append(platform)
    try:
        yield
    finally:
        _platform_override.pop()


def current_platform() -> str:
    """The platform kernels are chosen for: `kernel_platform`'s, else JAX's default backend."""
    if _platform_override:
        return _platform_override[-1]
    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def say_once(message: str) -> None:
    """Log a kernel fallback the first time it happens in this process."""
    if message not in _said:
        _said.add(message)
        logger.warning(message)


def choose_kernel(
    implementation: str | None,
    *,
    query: jax.Array,
    key: jax.Array,
    mask_arguments: KernelArguments | None,
    has_score_bias: bool,
    return_weights: bool = False,
    dropout_active: bool = False,
) -> Kernel:
    """The kernel for one attention call (see the module docstring).

    `implementation` is the model's setting: None picks by platform (explicit on a CPU; cuDNN
    for bf16/fp16 on a GPU where it can serve the call, else XLA), "explicit", "xla" or
    "cudnn" ask for one. Returning the weights and attention dropout need the explicit path.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    platform = current_platform()
    if dropout_active and platform == "gpu" and implementation != "explicit":
        say_once(
            "attention dropout needs the attention weights, so attention runs zoo's explicit "
            "softmax instead of a fused kernel; attention_dropout=0 lets it run fused"
        )
    if return_weights or dropout_active or implementation == "explicit":
        return "explicit"
    if implementation is None and platform != "gpu":
        return "explicit"
    if implementation == "xla" or platform != "gpu":
        if implementation == "cudnn":
            say_once(f"cuDNN attention needs an NVIDIA GPU; running XLA's attention on {platform}")
        return "xla"
    refusal = cudnn_refusal(query, key, mask_arguments, has_score_bias)
    if refusal is None:
        return "cudnn"
    say_once(f"cuDNN attention cannot serve this call ({refusal}); running XLA's attention")
    return "xla"


def cudnn_refusal(
    query: jax.Array,
    key: jax.Array,
    mask_arguments: KernelArguments | None,
    has_score_bias: bool,
) -> str | None:
    """Why cuDNN's fused attention cannot run this call, or None if it can.

    The limits are cuDNN's flash attention as JAX calls it: bf16 or fp16, a head size that is
    a multiple of 8 up to 128 (256 on Hopper and later), a mask said in lengths, causal order
    and a left window, and even lengths where a score bias is trained.
    """
    if query.dtype not in CUDNN_DTYPES:
        return f"it takes bf16 or fp16, not {query.dtype}"
    head_dim = query.shape[-1]
    limit = 256 if _hopper_or_later() else 128
    if head_dim % 8 != 0 or head_dim > limit:
        return f"head_dim={head_dim} is not a multiple of 8 up to {limit}"
    if mask_arguments is None:
        return "the mask is an array (segments or an explicit mask), not lengths and flags"
    if has_score_bias and (query.shape[0] % 2 != 0 or key.shape[0] % 2 != 0):
        return (
            f"a score bias needs even query and key lengths, got {query.shape[0]} and "
            f"{key.shape[0]}"
        )
    if not _cudnn_available():
        return "no cuDNN was found"
    return None


def _hopper_or_later() -> bool:
    """True on a Hopper (sm_90) or later GPU, and when tracing for a GPU on another machine."""
    if _platform_override:
        return True
    try:
        capability = jax.devices()[0].compute_capability  # type: ignore[attr-defined]
        return float(capability) >= 9.0
    except (AttributeError, ValueError, RuntimeError):
        return False


def _cudnn_available() -> bool:
    """Whether JAX finds cuDNN (private JAX names: any failure means "no")."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused

        return fused.check_cudnn_version() > 0
    except Exception:  # a moved private name, no CUDA plugin, no cuDNN
        return False
