"""A mixture of experts' adapters in PEFT's per-expert layout.

PEFT names an adapter on a routed expert by the expert's own module, as the checkpoints lay the
experts out: `model.layers.0.mlp.experts.3.gate_proj` (Qwen-MoE, OLMoE),
`model.layers.0.block_sparse_moe.experts.3.w1` (Mixtral), each with `lora_A` `[rank, in]` and
`lora_B` `[out, rank]`. zoo keeps one `LoRAExperts` per stacked projection, `lora_a`
`[layers, experts, in, rank]` and `lora_b` `[layers, experts, rank, out]`: expert e of layer i
is `lora_A = lora_a[i, e].T` and `lora_B = lora_b[i, e].T` (the HF weight is zoo's transposed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import jax.numpy as jnp
import numpy as np

from zoo.interop.rules import Rule
from zoo.interop.zoo_keys import row_names
from zoo.nn.layer_index import LayerIndex
from zoo.nn.lora import LoRAExperts, expert_projections, lora_experts
from zoo.nn.quantized import QuantizedExperts, float_dtype

# one adapter on one HF module: A [rank, in], B [out, rank] and its scale (alpha / rank)
Adapter = tuple[np.ndarray, np.ndarray, float]
# where a HF expert module sits in zoo: (stacked projection path, layer index, expert index)
Place = tuple[str, int | None, int]


class ExpertLayout:
    """The expert projections of a zoo model seen from HF: one module per layer and expert."""

    def __init__(self, model: object, rules: Iterable[Rule], index: LayerIndex):
        projections: dict[str, object] = dict(expert_projections(model))  # type: ignore[arg-type]
        projections |= {path: layer.base for path, layer in lora_experts(model).items()}  # type: ignore[arg-type]
        self.projections = projections
        self.index = index
        flat: dict[str, tuple[str, int | None]] = {}
        for path in projections:
            for name, row in row_names(path, index):
                flat[name] = (path, row)
        self.by_zoo: dict[str, list[str]] = {}  # flat zoo projection -> HF module per expert
        self.by_module: dict[str, Place] = {}
        for rule in rules:
            if len(rule.zoo) != 1 or len(rule.hf) < 2 or rule.zoo[0] not in flat:
                continue
            if not all(key.endswith(".weight") for key in rule.hf):
                continue
            modules = [key.removesuffix(".weight") for key in rule.hf]
            self.by_zoo[rule.zoo[0]] = modules
            path, row = flat[rule.zoo[0]]
            for expert, module in enumerate(modules):
                self.by_module[module] = (path, row, expert)

    def adapters(self, model: object) -> dict[str, Adapter]:
        """HF expert module -> (A, B, scale) of every `LoRAExperts` of `model`."""
        out: dict[str, Adapter] = {}
        for path, layer in lora_experts(model).items():  # type: ignore[arg-type]
            a_all = np.asarray(layer.lora_a, np.float32)
            b_all = np.asarray(layer.lora_b, np.float32)
            for name, index in row_names(path, self.index):
                if name not in self.by_zoo:
                    raise ValueError(
                        f"{path} has no per-expert HuggingFace counterpart, so its adapters "
                        "cannot be written in PEFT's format"
                    )
                a = a_all if index is None else a_all[index]
                b = b_all if index is None else b_all[index]
                for expert, module in enumerate(self.by_zoo[name]):
                    out[module] = (a[expert].T, b[expert].T, layer.scale)
        return out

    def stacked(self, found: Mapping[str, Adapter]) -> dict[str, LoRAExperts]:
        """One `LoRAExperts` per projection from the per-expert adapters `found` (HF module ->
        A, B, scale); experts or layers the adapter skips get zero adapters."""
        grouped: dict[str, dict[tuple[int | None, int], Adapter]] = {}
        for module, adapter in found.items():
            path, index, expert = self.by_module[module]
            grouped.setdefault(path, {})[(index, expert)] = adapter
        return {path: self._stack(path, parts) for path, parts in grouped.items()}

    def _stack(self, path: str, parts: dict[tuple[int | None, int], Adapter]) -> LoRAExperts:
        base = self.projections[path]
        shape = base.shape  # type: ignore[attr-defined]
        *lead, d_in, d_out = shape
        rank = max(a.shape[0] for a, _, _ in parts.values())
        scales = {scale for _, _, scale in parts.values()}
        fold = len(scales) > 1  # one scale for the stack: differing ones go into B
        scale = 1.0 if fold else scales.pop()
        a_all = np.zeros((*lead, d_in, rank), np.float32)
        b_all = np.zeros((*lead, rank, d_out), np.float32)
        for (index, expert), (a, b, own_scale) in parts.items():
            at = (expert,) if index is None else (index, expert)
            if a.shape[1] != d_in or b.shape[0] != d_out:
                raise ValueError(
                    f"an expert adapter of {path} has lora_A {list(a.shape)} and lora_B "
                    f"{list(b.shape)}; this model's experts are {d_out} x {d_in} (out x in)"
                )
            a_all[(*at, slice(None), slice(0, a.shape[0]))] = a.T
            b_all[(*at, slice(0, a.shape[0]))] = b.T * (own_scale if fold else 1.0)
        dtype = float_dtype(base)  # type: ignore[arg-type]
        base_array: QuantizedExperts | jnp.ndarray = base  # type: ignore[assignment]
        return LoRAExperts(
            base_array, jnp.asarray(a_all, dtype), jnp.asarray(b_all, dtype), alpha=scale * rank
        )
