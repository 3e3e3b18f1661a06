"""A frozen quantized base for LoRA: `quantize(model, "int8")`, or QLoRA's `quantize(model, "nf4")`.

The layers themselves, `zoo.nn.QuantizedLinear` (int8 weight, one float32 scale per output row)
and `zoo.nn.nf4.NF4Linear` (4-bit NormalFloat in blocks of 64, double-quantized scales), and
the tree operations `zoo.save` and `zoo.load` need live in `zoo/nn/quantized.py`; this module
chooses which layers of a model to quantize.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import equinox as eqx

from zoo.lora.targets import ROUTING, matches
from zoo.nn.quantized import float_experts, float_linears, quantize_at

MODES = ("int8", "nf4")
Model = TypeVar("Model", bound=eqx.Module)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(
            f"unknown quantization {mode!r}; zoo quantizes a frozen base to 'int8' "
            "(per-channel scales) or 'nf4' (QLoRA's 4-bit NormalFloat)"
        )


def _skipped(path: str, skip: Iterable[str]) -> bool:
    top = path.split(".")[0]
    return any(top == prefix or path == prefix or path.startswith(f"{prefix}.") for prefix in skip)


def quantize(
    model: Model, mode: str = "int8", *, skip: Sequence[str] = ("head", "output_proj")
) -> Model:
    """`model` with every `Linear` (plain, or the base of a `LoRALinear`) stored in int8
    (`mode="int8"`) or NF4 (`"nf4"`, `zoo.nn.nf4`), and, in int8, every stacked expert
    projection of a mixture of experts (`QuantizedExperts`: a scale per expert and output
    column; NF4 leaves a mixture's experts alone, refused if named).

    Layers under the `skip` path prefixes stay float: by default the output layers (a
    classifier's `head`, a translator's `output_proj`), which often train whole. Embeddings,
    norms and a mixture's routing (its router, the shared expert's gate) stay float too.
    Quantize before or after `zoo.lora.apply`; the adapters stay float. `merge` of a quantized
    model folds the adapters into the dequantized weights (float32).
    """
    _check_mode(mode)
    experts = list(float_experts(model)) if mode == "int8" else []
    candidates = [*float_linears(model), *experts]
    chosen = [
        path
        for path in candidates
        if not _skipped(path, skip)
        and not any(matches(path.removesuffix(".base"), routing) for routing in ROUTING)
    ]
    if not chosen:
        raise ValueError(f"nothing to quantize: every Linear layer is under skip={list(skip)}")
    return quantize_at(model, chosen, mode)
