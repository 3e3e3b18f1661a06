"""Parameter-efficient fine-tuning: LoRA adapters as tree operations, saved in PEFT's format.

- `apply(model, rank=8, alpha=16, targets="attention", key=key)` wraps the chosen `Linear`s;
- `only_adapters(optimizer)` trains the adapters only (optimizer state for them alone);
- `merge(model)` folds the adapters into the weights, `unmerge(merged, adapted)` undoes it;
- `chain(model, "continue" | "merge", rank=..., ...)` trains on from a model that already has
  adapters: the same adapters further, or new ones over the merged base;
- `quantize(model, "int8")` stores the frozen base layers in int8 (QLoRA-style);
- `save_adapter` / `load_adapter` write and read `adapter_config.json` +
  `adapter_model.safetensors` as the `peft` library does.

The layers, `LoRALinear` and `QuantizedLinear` (and for a mixture's stacked experts
`LoRAExperts` and `QuantizedExperts`), and where a model holds them (`lora_layers`,
`describe`, `quantized_paths`, ...) are in `zoo.nn`, where `zoo.save` and `zoo.load` find them.
"""

from __future__ import annotations

from zoo.lora.adapters import adapter_arrays, apply, merge, only_adapters, trainable_labels, unmerge
from zoo.lora.chain import LORA_INIT_MODES, chain
from zoo.lora.peft import save_adapter
from zoo.lora.peft_load import load_adapter
from zoo.lora.quantized import quantize
from zoo.lora.targets import GROUPS
from zoo.nn.lora import (
    LoRAExperts,
    LoRALinear,
    describe,
    has_lora,
    linear_paths,
    lora_experts,
    lora_layers,
    rebuild,
)
from zoo.nn.nf4 import NF4Linear
from zoo.nn.quantized import QuantizedExperts, QuantizedLinear, dequantize, quantized_paths

__all__ = [
    "GROUPS",
    "LORA_INIT_MODES",
    "LoRAExperts",
    "LoRALinear",
    "NF4Linear",
    "QuantizedExperts",
    "QuantizedLinear",
    "adapter_arrays",
    "apply",
    "chain",
    "dequantize",
    "describe",
    "has_lora",
    "linear_paths",
    "load_adapter",
    "lora_experts",
    "lora_layers",
    "merge",
    "only_adapters",
    "quantize",
    "quantized_paths",
    "rebuild",
    "save_adapter",
    "trainable_labels",
    "unmerge",
]
