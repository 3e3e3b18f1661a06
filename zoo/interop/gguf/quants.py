"""GGML tensor types -> float32, through the `gguf` package's `gguf.quants.dequantize`.

The types zoo reads are exactly those the installed `gguf` package dequantizes: F32, F16,
BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants (Q2_K to Q6_K) and, in recent releases, the
IQ, TQ and FP4 types. A type it cannot dequantize (integer tensors, Q8_1, Q8_K, a type newer
than the package) is refused by name, listing the types that can be read.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from zoo.extras import pip_install

INSTALL_GGUF = pip_install("gguf")


def require_gguf() -> None:
    """An ImportError that says which extra installs the `gguf` package, where it is missing.
    Every function that uses the package calls it first, then imports the package."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError(f"reading a .gguf file needs the gguf package: {INSTALL_GGUF}") from None


def type_name(ggml_type: int) -> str:
    """The GGML name of `ggml_type` (`Q4_K`), or `unknown type N` for one the package lacks."""
    require_gguf()
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"unknown type {ggml_type}"


@cache
def dequantizes(ggml_type: int) -> bool:
    """Whether the installed `gguf` package dequantizes `ggml_type` (tried on one zero block)."""
    require_gguf()
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    try:
        kind = GGMLQuantizationType(ggml_type)
    except ValueError:
        return False
    block_size, type_size = GGML_QUANT_SIZES[kind]
    typed = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}.get(kind)
    block = np.zeros(block_size, typed) if typed else np.zeros((1, type_size), np.uint8)
    try:
        quants.dequantize(block, kind)
    except NotImplementedError:
        return False
    return True


def supported_names() -> str:
    """The names of every type the installed package dequantizes, in GGML's order."""
    require_gguf()
    from gguf import GGMLQuantizationType

    return ", ".join(kind.name for kind in GGMLQuantizationType if dequantizes(int(kind)))


def dequantize(data: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of numpy shape `shape` from a tensor's stored `data` (as the reader
    gives it: typed for F32/F16, bytes for the block types)."""
    require_gguf()
    from gguf import GGMLQuantizationType, quants

    values = quants.dequantize(data, GGMLQuantizationType(ggml_type))
    if np.may_share_memory(values, data):  # F32 comes back as a view of the mapped file
        values = values.copy()
    return values.astype(np.float32, copy=False).reshape(shape)
