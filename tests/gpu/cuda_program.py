"""Read the kernels of a zoo program lowered for CUDA on a machine without a GPU
(`zoo.bench.cuda_lowering` lowers it: its docstring names the private JAX and Equinox names
pinned there)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from zoo.bench.cuda_lowering import (  # noqa: F401  (the tests import them from here)
    CUDNN_VERSION,
    as_if_on_a_gpu,
    cuda_text,
    lowering_unavailable,
    separate_traces,
)

CALL = re.compile(r"stablehlo\.custom_call @__cudnn\$(fmha\w*)\((.*)")
CONFIG = re.compile(r'backend_config = "((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class FusedCall:
    """One cuDNN fused-attention custom call of a lowered program."""

    name: str  # fmhaSoftmax, fmhaScaleBiasSoftmax, ...Backward
    mask_type: str  # NO_MASK, CAUSAL, PADDING, PADDING_CAUSAL
    sliding_window: int  # 0: none
    operands: str  # the operand types, e.g. (tensor<4x32x4x16xbf16>, ...)

    @property
    def backward(self) -> bool:
        return self.name.endswith("Backward")

    @property
    def kind(self) -> tuple[str, str]:
        return ("backward" if self.backward else "forward", self.mask_type)


def fused_calls(text: str) -> list[FusedCall]:
    """Every cuDNN fused-attention call in a lowered program's text."""
    calls = []
    for line in text.splitlines():
        found = CALL.search(line)
        if found is None:
            continue
        config_text = CONFIG.search(line)
        assert config_text is not None, line[:300]
        config = json.loads(config_text.group(1).replace("\\22", '"'))["cudnn_fmha_backend_config"]
        operands = line[line.rindex(" : (") + 3 :] if " : (" in line else ""
        calls.append(
            FusedCall(
                found.group(1),
                config["mask_type"],
                int(config.get("sliding_window_length", 0)),
                operands,
            )
        )
    return calls


def kinds(text: str) -> set[tuple[str, str]]:
    """The (forward|backward, mask type) pairs of a program's fused attention calls."""
    return {call.kind for call in fused_calls(text)}
