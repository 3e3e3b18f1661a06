"""Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (`*ForCausalLM`) <-> a mixture-of-experts `zoo.GPT`.

Each is its dense sibling (Mistral, Qwen2, Qwen3, a Llama with whole-projection QK-norm) whose
MLP is a router over experts (`zoo.nn.moe`):

| family    | router + experts                                        | top-k renormalised    |
| --------- | ------------------------------------------------------- | --------------------- |
| mixtral   | `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1/w3/w2` | always         |
| qwen2_moe | `mlp.gate`, `mlp.experts.N.gate_proj/up_proj/down_proj`, plus `mlp.shared_expert.*` and `mlp.shared_expert_gate` | `norm_topk_prob` |
| qwen3_moe | `mlp.gate`, `mlp.experts.N.gate_proj/up_proj/down_proj` | `norm_topk_prob`      |
| olmoe     | as qwen3_moe; `self_attn.q_norm`/`k_norm` over the whole projections | `norm_topk_prob` |

Checkpoints store one matrix per expert (what the hub holds and what transformers'
`save_pretrained` writes, though transformers 5 fuses them in memory); zoo stacks them into one
`[experts, in, out]` array per projection. Qwen's dense layers among the sparse ones
(`mlp_only_layers`, `decoder_sparse_step > 1`) are the config's fields of the same names: their
`mlp.gate_proj/up_proj/down_proj` (`intermediate_size` wide) load into a dense gated
feed-forward, a group of its own in the layer stack. Mixtral and OLMoE route on every layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from zoo.interop.architecture import HFConfig, UnsupportedExport, require_fields
from zoo.interop.architectures.llama import LlamaFamily, Mistral, Qwen2, Qwen3
from zoo.interop.rules import KeyMap, Rule, Shape, Transform, rule
from zoo.models import GPTConfig


def _stack(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [np.stack([a.T for a in arrays])]


# one torch Linear weight [out, in] per expert <-> zoo's stacked [experts, in, out]
STACKED_EXPERTS = Transform(
    "per-expert Linear weights stacked (transposed)",
    _stack,
    lambda z: [a.T for a in z[0]],
    lambda s: [(s[0][2], s[0][1])] * s[0][0],
)


class MoEFamily(LlamaFamily):
    """What the four share: the router and the stacked experts; subclasses name the keys."""

    moe_prefix = "mlp"  # the layer's sub-module holding the router and the experts
    projections = ("gate_proj", "up_proj", "down_proj")  # an expert's gate, up and down
    experts_option = "num_experts"  # config.json's expert count
    always_renormalise = False  # Mixtral renormalises the top-k weights without an option
    has_shared_expert = False  # Qwen2-MoE
    qk_norm_scope = "head"  # OLMoE: "projection"

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        fields = super().zoo_fields(hf, shapes)
        if self.name in ("qwen2_moe", "qwen3_moe"):
            fields.update(
                mlp_only_layers=tuple(hf["mlp_only_layers"] or ()),
                decoder_sparse_step=hf["decoder_sparse_step"] or 1,
            )
        if hf["router_jitter_noise"]:
            hf.refuse("router_jitter_noise", "zoo's router adds no noise", "set it to 0")
        if hf["clip_qkv"] is not None:
            hf.refuse("clip_qkv", "zoo does not clamp the query/key/value projections")
        # transformers 5 writes Qwen3-MoE's count as num_local_experts; the hub has num_experts
        spellings = (self.experts_option, "num_local_experts", "num_experts")
        experts = next((hf.data[k] for k in spellings if k in hf.data), hf[self.experts_option])
        width = hf["intermediate_size"] if self.name == "mixtral" else hf["moe_intermediate_size"]
        fields.update(
            num_experts=experts,
            num_experts_per_tok=hf["num_experts_per_tok"],
            moe_intermediate_size=width,
            norm_topk_prob=True if self.always_renormalise else bool(hf["norm_topk_prob"]),
            router_aux_loss_coef=float(hf["router_aux_loss_coef"] or 0.0),
            qk_norm_scope=self.qk_norm_scope,
        )
        if self.has_shared_expert:
            fields["shared_expert_intermediate_size"] = hf["shared_expert_intermediate_size"]
            fields["qkv_bias"] = bool(hf["qkv_bias"])
        return fields

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        if not config.num_experts:
            raise UnsupportedExport(f"{self.export_class} is a mixture of experts: num_experts=0")
        require_fields(
            config,
            self.export_class,
            router="softmax",
            qk_norm_scope=self.qk_norm_scope,
            shared_expert_intermediate_size=config.shared_expert_intermediate_size
            if self.has_shared_expert
            else 0,
        )
        if self.always_renormalise and not config.norm_topk_prob:
            raise UnsupportedExport(f"{self.export_class} always renormalises: norm_topk_prob")
        settings = config.moe_settings()
        assert settings is not None
        out = super().hf_config(config)
        out.update(
            num_experts_per_tok=config.num_experts_per_tok,
            router_aux_loss_coef=config.router_aux_loss_coef,
            output_router_logits=False,
        )
        out[self.experts_option] = config.num_experts
        if self.name == "mixtral":
            out.update(intermediate_size=settings.moe_intermediate_size, router_jitter_noise=0.0)
        else:
            out.update(
                moe_intermediate_size=settings.moe_intermediate_size,
                norm_topk_prob=config.norm_topk_prob,
            )
        dense = [i for i, routed in enumerate(config.routed_layers()) if not routed]
        if self.name in ("qwen2_moe", "qwen3_moe"):
            # DeepSeek's leading dense layers are Qwen's explicit ones
            step = config.decoder_sparse_step
            listed = [i for i in dense if (i + 1) % step == 0]
            out.update(decoder_sparse_step=step, mlp_only_layers=listed)
        elif dense:
            raise UnsupportedExport(
                f"{self.export_class} routes every layer; layers {dense} are dense "
                "(mlp_only_layers, decoder_sparse_step, first_k_dense_replace)"
            )
        if self.has_shared_expert:
            out["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
        return out

    def stored_keys(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """Per-expert keys (the files' layout) from transformers 5's in-memory state dict, which
        fuses each layer's experts: `mlp.experts.gate_up_proj` `[experts, 2 * width, d_model]`
        and `mlp.experts.down_proj` `[experts, d_model, width]`."""
        out = {}
        gate, up, down = self.projections
        for key, array in arrays.items():
            fused = re.fullmatch(
                r"(model\.layers\.\d+\.)mlp\.experts\.(gate_up_proj|down_proj)", key
            )
            if fused is None:
                out[key] = array
                continue
            layer = f"{fused.group(1)}{self.moe_prefix}.experts."
            if self.name == "mixtral":  # in memory its router is `mlp.gate`, too
                router = f"{fused.group(1)}mlp.gate.weight"
                if router in arrays:
                    out[f"{fused.group(1)}{self.moe_prefix}.gate.weight"] = arrays[router]
            for e, expert in enumerate(array):
                if fused.group(2) == "down_proj":
                    out[f"{layer}{e}.{down}.weight"] = expert
                else:
                    half = expert.shape[0] // 2
                    out[f"{layer}{e}.{gate}.weight"] = expert[:half]
                    out[f"{layer}{e}.{up}.weight"] = expert[half:]
        if self.name == "mixtral":
            out = {
                k: v
                for k, v in out.items()
                if not re.fullmatch(r"model\.layers\.\d+\.mlp\.gate\.weight", k)
            }
        return out

    def fused_keys(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """transformers 5's in-memory state dict from per-expert (file-layout) keys: the inverse
        of `stored_keys`. Each layer's experts become `mlp.experts.gate_up_proj`
        `[experts, 2 * width, d_model]` (gate rows first) and `mlp.experts.down_proj`
        `[experts, d_model, width]`; Mixtral's router moves to `mlp.gate`."""
        gate, up, down = self.projections
        expert = re.compile(
            rf"(model\.layers\.\d+\.){self.moe_prefix}\.experts\.(\d+)\.(\w+)\.weight"
        )
        experts: dict[str, dict[str, dict[int, Any]]] = {}
        out = {}
        for key, array in arrays.items():
            found = expert.fullmatch(key)
            if found is None:
                if self.name == "mixtral":
                    key = re.sub(
                        r"^(model\.layers\.\d+\.)block_sparse_moe\.gate\.", r"\1mlp.gate.", key
                    )
                out[key] = array
                continue
            layer, number, projection = found.group(1), int(found.group(2)), found.group(3)
            experts.setdefault(layer, {}).setdefault(projection, {})[number] = array
        for layer, by_projection in experts.items():

            def ordered(projection: str, by_projection=by_projection) -> list[Any]:
                return [by_projection[projection][e] for e in sorted(by_projection[projection])]

            pairs = zip(ordered(gate), ordered(up), strict=True)
            out[f"{layer}mlp.experts.gate_up_proj"] = np.stack(
                [np.concatenate([g, u], axis=0) for g, u in pairs]
            )
            out[f"{layer}mlp.experts.down_proj"] = np.stack(ordered(down))
        return out

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        dense = super().key_map(config, shapes)
        routed = config.routed_layers()
        sparse = tuple(f"layers.{i}.feed_forward." for i in range(config.num_layers) if routed[i])
        rules = [r for r in dense.rules if not any(z.startswith(sparse) for z in r.zoo)]
        for i in (i for i in range(config.num_layers) if routed[i]):
            hf, zoo = f"model.layers.{i}.{self.moe_prefix}.", f"layers.{i}.feed_forward."
            rules.append(rule(f"{hf}gate.weight", f"{zoo}router.weight"))
            for hf_name, zoo_name in zip(self.projections, ("gate", "up", "down"), strict=True):
                keys = tuple(f"{hf}experts.{e}.{hf_name}.weight" for e in range(config.num_experts))
                rules.append(Rule(keys, (f"{zoo}experts.{zoo_name}",), STACKED_EXPERTS))
            if self.has_shared_expert:
                for hf_name, zoo_name in (
                    ("gate_proj", "gate"),
                    ("up_proj", "hidden"),
                    ("down_proj", "output"),
                ):
                    rules.append(
                        rule(
                            f"{hf}shared_expert.{hf_name}.weight", f"{zoo}shared.{zoo_name}.weight"
                        )
                    )
                rules.append(rule(f"{hf}shared_expert_gate.weight", f"{zoo}shared_gate.weight"))
        return KeyMap(rules, dense.derived, dense.ignore)


class Mixtral(MoEFamily, Mistral):
    name = "mixtral"
    model_type = "mixtral"
    loads = ("MixtralForCausalLM", "MixtralModel")
    export_class = "MixtralForCausalLM"
    config_class = "MixtralConfig"
    moe_prefix = "block_sparse_moe"
    projections = ("w1", "w3", "w2")
    experts_option = "num_local_experts"
    always_renormalise = True
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        intermediate_size=14336,
        num_key_value_heads=8,
        max_position_embeddings=4096 * 32,
        rope_theta=1e6,
        sliding_window=None,
        num_experts_per_tok=2,
        num_local_experts=8,
        router_aux_loss_coef=0.001,
        router_jitter_noise=0.0,
    )


class Qwen2MoE(MoEFamily, Qwen2):
    name = "qwen2_moe"
    model_type = "qwen2_moe"
    loads = ("Qwen2MoeForCausalLM", "Qwen2MoeModel")
    export_class = "Qwen2MoeForCausalLM"
    config_class = "Qwen2MoeConfig"
    has_shared_expert = True
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        Qwen2.extra_defaults,
        intermediate_size=5632,
        num_key_value_heads=16,
        hidden_size=2048,
        num_hidden_layers=24,
        num_attention_heads=16,
        decoder_sparse_step=1,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        num_experts_per_tok=4,
        num_experts=60,
        norm_topk_prob=False,
        router_aux_loss_coef=0.001,
        mlp_only_layers=[],
        qkv_bias=True,
    )

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        out = super().hf_config(config)
        out["qkv_bias"] = bool(config.use_bias if config.qkv_bias is None else config.qkv_bias)
        return out


class Qwen3MoE(MoEFamily, Qwen3):
    name = "qwen3_moe"
    model_type = "qwen3_moe"
    loads = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")
    export_class = "Qwen3MoeForCausalLM"
    config_class = "Qwen3MoeConfig"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        Qwen2.extra_defaults,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=None,
        decoder_sparse_step=1,
        moe_intermediate_size=768,
        num_experts_per_tok=8,
        num_experts=128,
        norm_topk_prob=False,
        router_aux_loss_coef=0.001,
        mlp_only_layers=[],
    )


class OLMoE(MoEFamily):
    name = "olmoe"
    model_type = "olmoe"
    loads = ("OlmoeForCausalLM", "OlmoeModel")
    export_class = "OlmoeForCausalLM"
    config_class = "OlmoeConfig"
    has_qk_norm = True
    qk_norm_scope = "projection"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=None,
        eos_token_id=50279,
        clip_qkv=None,
        num_experts_per_tok=8,
        num_experts=64,
        norm_topk_prob=False,
        router_aux_loss_coef=0.01,
    )


MOE_FAMILIES = (Mixtral(), Qwen2MoE(), Qwen3MoE(), OLMoE())


def moe_family_for(config: GPTConfig) -> MoEFamily:
    """The HuggingFace family a mixture-of-experts zoo GPT exports to."""
    mixtral, qwen2_moe, qwen3_moe, olmoe = MOE_FAMILIES
    if config.shared_expert_intermediate_size:
        return qwen2_moe
    if config.qk_norm and config.qk_norm_scope == "projection":
        return olmoe
    if config.qk_norm:
        return qwen3_moe
    return mixtral


__all__ = [
    "MOE_FAMILIES",
    "Mixtral",
    "MoEFamily",
    "OLMoE",
    "Qwen2MoE",
    "Qwen3MoE",
    "moe_family_for",
]
