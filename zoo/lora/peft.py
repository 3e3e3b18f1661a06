"""LoRA adapters in the `peft` library's format, both ways.

A PEFT adapter folder holds `adapter_config.json` (rank, alpha, target modules, ...) and
`adapter_model.safetensors` with keys such as
`base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`. The HuggingFace module names come
from the interop key maps (`zoo.interop`): a zoo Linear maps to the HF layer holding its weight.

A mixture of experts' adapters are written per expert, as PEFT names them on per-expert modules
(`...mlp.experts.3.gate_proj`, Mixtral's `...block_sparse_moe.experts.3.w1`): see
`zoo.lora.peft_experts`.

GPT-2 fuses query, key and value into one `c_attn`. Adapters on zoo's separate projections export
exactly as one adapter on `c_attn` whose `A` stacks theirs (rank `3 r` for q, k and v) and whose
`B` is block-diagonal; a PEFT adapter on `c_attn` imports as one adapter per projection that
shares `A` and takes its rows of `B`. Both give the same outputs.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import TypedDict

import equinox as eqx
import jax
import numpy as np

from zoo.files import write_text_atomic
from zoo.interop.architecture import Architecture, config_of
from zoo.interop.architectures import architecture_for
from zoo.interop.weights import write_safetensors
from zoo.interop.zoo_keys import row_names, zoo_state
from zoo.lora.adapters import ADAPTER_LEAVES, adapter_arrays
from zoo.lora.peft_experts import ExpertLayout
from zoo.lora.peft_targets import peft_targets
from zoo.models import flavor_of
from zoo.nn.layer_index import LayerIndex
from zoo.nn.linear import Linear
from zoo.nn.lora import lora_layers, plain_linears
from zoo.nn.nf4 import NF4Linear
from zoo.nn.quantized import QuantizedLinear
from zoo.tree import path_name

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
TASK_TYPES = {"gpt": "CAUSAL_LM", "classifier": "SEQ_CLS", "translator": "SEQ_2_SEQ_LM"}
# one adapter on one HF module: A [rank, in], B [out, rank] and its scale (alpha / rank)
Adapter = tuple[np.ndarray, np.ndarray, float]


class AdapterConfig(TypedDict, total=False):
    """`adapter_config.json`: the keys of PEFT's `LoraConfig` that zoo writes or reads."""

    peft_type: str  # "LORA"
    task_type: str  # CAUSAL_LM, SEQ_CLS, SEQ_2_SEQ_LM
    base_model_name_or_path: str | None
    r: int  # the rank of most modules
    lora_alpha: float
    rank_pattern: dict[str, int]  # module name pattern -> rank, where it differs from r
    alpha_pattern: dict[str, float]
    target_modules: list[str] | str  # short names, or one regex over the full names
    modules_to_save: list[str] | None  # modules trained whole (a classifier head)
    fan_in_fan_out: bool  # GPT-2's Conv1D stores weights [in, out]
    lora_dropout: float
    bias: str  # "none": zoo trains no LoRA biases
    lora_bias: bool
    use_rslora: bool  # scale alpha / sqrt(r) instead of alpha / r
    use_dora: bool
    init_lora_weights: bool
    inference_mode: bool


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


class _Layout:
    """A zoo model's Linear layers seen from HF: module name -> [(zoo path, layer, slot)]."""

    def __init__(self, model: eqx.Module):
        self.arch: Architecture = architecture_for(model)
        key_map = self.arch.key_map(config_of(model))
        self.rules = key_map.rules
        linears: dict[str, Linear | QuantizedLinear | NF4Linear] = plain_linears(model) | {
            path: layer.base for path, layer in lora_layers(model).items()
        }
        self.linears = linears
        self.index = LayerIndex(model)
        flat = {}  # "layers.0.self_attention.query_proj" -> (stacked path, row)
        for path in linears:
            for name, row in row_names(path, self.index):
                flat[name] = (path, row)
        self.by_zoo: dict[str, tuple[str, int, int]] = {}  # flat zoo Linear -> (module, slot, n)
        self.by_module: dict[str, list[tuple[str, int | None, int]]] = {}
        self.fan_in_fan_out: dict[str, bool] = {}
        for rule in self.rules:
            hf = rule.hf[0]
            if len(rule.hf) != 1 or not hf.endswith(".weight"):
                continue
            names = [z.removesuffix(".weight") for z in rule.zoo]
            if not all(z.endswith(".weight") and n in flat for z, n in zip(rule.zoo, names)):
                continue
            module = hf.removesuffix(".weight")
            self.fan_in_fan_out[module] = rule.transform.name != "copy"
            for slot, name in enumerate(names):
                self.by_zoo[name] = (module, slot, len(names))
                self.by_module.setdefault(module, []).append((*flat[name], slot))
        self.experts = ExpertLayout(model, self.rules, self.index)  # per-expert modules
        self.fan_in_fan_out |= {module: False for module in self.experts.by_module}

    def slot_rows(self, module: str) -> list[tuple[int, int]]:
        """Row ranges of each fused slot in the HF weight `[out, in]` of `module`."""
        rows, start = [], 0
        for path, _, _ in self.by_module[module]:
            size = self.linears[path].out_features
            rows.append((start, start + size))
            start += size
        return rows


def _module_adapters(model: eqx.Module, layout: _Layout) -> dict[str, Adapter]:
    """HF module -> (A [r, in], B [out, r], scale) of every adapted layer of `model`."""
    parts: dict[str, dict[int, Adapter]] = {}
    for path, layer in lora_layers(model).items():
        a_all, b_all = np.asarray(layer.lora_a, np.float32), np.asarray(layer.lora_b, np.float32)
        for name, index in row_names(path, layout.index):
            if name not in layout.by_zoo:
                raise ValueError(
                    f"{path} has no HuggingFace {layout.arch.export_class} counterpart, so its "
                    "adapter cannot be written in PEFT's format; choose targets among the "
                    "attention and feed-forward layers"
                )
            module, slot, _ = layout.by_zoo[name]
            a = a_all if index is None else a_all[index]
            b = b_all if index is None else b_all[index]
            parts.setdefault(module, {})[slot] = (a, b, layer.scale)
    adapters = {}
    for module, slots in parts.items():
        rows = layout.slot_rows(module)
        if len(rows) == 1:
            adapters[module] = slots[0]
            continue
        # fused (GPT-2's c_attn): A stacks the slots' A, B is block-diagonal
        scale = next(iter(slots.values()))[2]
        ranks = [slots[s][0].shape[0] for s in sorted(slots)]
        a = np.concatenate([slots[s][0] for s in sorted(slots)], axis=0)
        b = np.zeros((rows[-1][1], sum(ranks)), np.float32)
        column = 0
        for s in sorted(slots):
            slot_a, slot_b, slot_scale = slots[s]
            start, stop = rows[s]
            b[start:stop, column : column + slot_a.shape[0]] = slot_b * (slot_scale / scale)
            column += slot_a.shape[0]
        adapters[module] = (a, b, scale)
    return adapters | layout.experts.adapters(model)


def _target_modules(adapters: dict[str, Adapter], layout: _Layout) -> list[str] | str:
    """The adapted modules as PEFT writes a user's targets (`zoo.lora.peft_targets`); the
    experts by their leaf name (`w1`, `gate_proj`), which is what peft maps onto transformers
    5's fused experts. Targeting per layer beside experts lists the other modules in full."""
    experts = layout.experts.by_module
    plain = {module for module in adapters if module not in experts}
    leaves = {module.rsplit(".", 1)[-1] for module in adapters if module in experts}
    every = set(layout.by_module) | set(experts)
    targets = peft_targets(plain, every, named_elsewhere=set(adapters) - plain)
    if isinstance(targets, str):
        return sorted(plain | leaves) if leaves else targets
    return sorted(set(targets) | leaves)


def _hf_extras(model: eqx.Module, layout: _Layout, train: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Arrays trained whole (a new classifier head) under their HF names."""
    extras = {
        name: leaf
        for name, leaf in adapter_arrays(model, train).items()
        if name.split(".")[-1] not in ADAPTER_LEAVES
    }
    if not extras:
        return {}
    state = zoo_state(_only(model, set(extras)))
    out = {}
    for rule in layout.rules:
        if len(rule.zoo) == 1 and rule.zoo[0] in state:
            out[rule.hf[0]] = rule.transform.to_hf([state.pop(rule.zoo[0])])[0]
    if state:
        raise ValueError(
            f"the trained arrays {sorted(state)} have no single HuggingFace counterpart; "
            "train whole layers such as the classifier head (train=head)"
        )
    return out


def _only(model: eqx.Module, names: set[str]) -> eqx.Module:
    arrays = eqx.filter(model, eqx.is_array)
    return jax.tree_util.tree_map_with_path(
        lambda p, leaf: leaf if path_name(p) in names else None, arrays
    )


def save_adapter(
    model: eqx.Module,
    directory: str | Path,
    *,
    train: tuple[str, ...] = (),
    base_model: str | None = None,
) -> Path:
    """Write `model`'s adapters (and arrays trained whole, `train`) as a PEFT adapter folder.

    `peft.PeftModel.from_pretrained(hf_model, directory)` then computes, on the transformers
    model exported by `zoo.to_hf`, what the adapted zoo model computes.
    """
    layout = _Layout(model)
    adapters = _module_adapters(model, layout)
    if not adapters:
        raise ValueError("this model has no LoRA adapters to save (see zoo.lora.apply)")
    tensors: dict[str, np.ndarray] = {}
    settings: dict[str, tuple[int, float]] = {}
    for module, (a, b, scale) in sorted(adapters.items()):
        tensors[f"{PREFIX}{module}.lora_A.weight"] = a
        tensors[f"{PREFIX}{module}.lora_B.weight"] = b
        settings[module] = (a.shape[0], scale * a.shape[0])
    extras = _hf_extras(model, layout, train)
    tensors |= {f"{PREFIX}{name}": array for name, array in extras.items()}
    rank, alpha = Counter(settings.values()).most_common(1)[0][0]
    odd = {module: value for module, value in settings.items() if value != (rank, alpha)}
    config: AdapterConfig = {
        "peft_type": "LORA",
        "task_type": TASK_TYPES[flavor_of(model)],
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "rank_pattern": {re.escape(m): r for m, (r, _) in odd.items()},
        "alpha_pattern": {re.escape(m): a for m, (_, a) in odd.items()},
        "target_modules": _target_modules(adapters, layout),
        "modules_to_save": sorted({name.rsplit(".", 1)[0] for name in extras}) or None,
        "fan_in_fan_out": any(layout.fan_in_fan_out[m] for m in adapters),
        # one rate for every adapter (zoo.lora.apply's); PEFT applies it in training only
        "lora_dropout": max((layer.dropout for layer in lora_layers(model).values()), default=0.0),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
                      directory / WEIGHTS_FILE)  # fmt: skip
    write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))
    return directory
