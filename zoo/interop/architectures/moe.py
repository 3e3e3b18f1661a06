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
`[experts, in, out]` array per projection. The experts are the base block's feed-forward
(`zoo.nn.MoESettings`); Qwen's dense layers among the sparse ones (`mlp_only_layers`,
`decoder_sparse_step > 1`) are an override (`layers.overrides`) with a dense gated
`FeedForwardSettings` (`intermediate_size` wide) on those layers, a group of its own in the layer
stack, whose `mlp.gate_proj/up_proj/down_proj` load as a dense model's. On export the layers'
resolved settings (`config.layers.layers()`) give `mlp_only_layers` and `decoder_sparse_step`
(the largest step that names the routed layers); Mixtral and OLMoE route on every layer.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from zoo.interop.architecture import ConfigFields, HFConfig, UnsupportedExport
from zoo.interop.architectures.llama import LlamaFamily, Mistral, Qwen2, Qwen3
from zoo.interop.rules import KeyMap, Rule, Shape, Transform, rule
from zoo.models import GPTConfig
from zoo.nn.block import BlockSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.moe import MoESettings
from zoo.nn.plan import LayerOverride
from zoo.presets.moe import MIXTRAL, OLMOE, QWEN2_MOE, QWEN3_MOE


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
    width_option = "moe_intermediate_size"  # config.json's expert width
    always_renormalise = False  # Mixtral renormalises the top-k weights without an option
    has_shared_expert = False  # Qwen2-MoE
    has_dense_layers = False  # Qwen: mlp_only_layers and decoder_sparse_step
    exports_scores = False  # its *ForSequenceClassification is not mapped

    # -- reading config.json ------------------------------------------------------------------

    def _dense_layers(self, hf: HFConfig, num_layers: int) -> tuple[int, ...]:
        """The layers whose MLP is dense (Qwen: listed in `mlp_only_layers`, or off the
        `decoder_sparse_step`), as transformers builds them."""
        if not self.has_dense_layers:
            return ()
        listed = hf["mlp_only_layers"] or ()
        step = hf["decoder_sparse_step"] or 1
        return tuple(i for i in range(num_layers) if i in listed or (i + 1) % step != 0)

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        """The dense sibling's fields, with the experts as the base block's feed-forward and
        the dense MLP on the layers that have one."""
        fields = super().zoo_fields(hf, shapes)
        if hf["router_jitter_noise"]:
            hf.refuse("router_jitter_noise", "zoo's router adds no noise", "set it to 0")
        if hf["clip_qkv"] is not None:
            hf.refuse("clip_qkv", "zoo does not clamp the query/key/value projections")
        # transformers 5 writes Qwen3-MoE's count as num_local_experts; the hub has num_experts
        spellings = (self.experts_option, "num_local_experts", "num_experts")
        option = next((k for k in spellings if k in hf.data), self.experts_option)
        if not hf[option]:
            hf.refuse(option, "a mixture of experts needs experts; without, it is a dense model")
        # the dense sibling's MLP, where a layer has one; the experts are the base block's
        dense = FeedForwardSettings(
            d_ff=hf["intermediate_size"],
            kind="gated",
            activation=hf.activation(self.activation_option),
            bias=bool(hf["mlp_bias"]),
            dropout=0.0,
        )
        for path in ("d_ff", "feed_forward.activation", "feed_forward.bias"):
            del fields[path]
        width = hf[self.width_option]
        shared = hf["shared_expert_intermediate_size"] if self.has_shared_expert else 0
        fields["feed_forward"] = MoESettings(
            num_experts=hf[option],
            top_k=hf["num_experts_per_tok"],
            d_ff=width,
            shared_d_ff=shared,
            normalize_top_k=True if self.always_renormalise else bool(hf["norm_topk_prob"]),
            router="softmax",
            activation=dense.activation,
            aux_loss_coef=float(hf["router_aux_loss_coef"] or 0.0),
        )
        dense_layers = self._dense_layers(hf, hf["num_hidden_layers"])
        overrides = (LayerOverride(changes={"feed_forward": dense}, layers=dense_layers),)
        fields["layers.overrides"] = overrides if dense_layers else ()
        if self.has_shared_expert:
            fields["attention.qkv_bias"] = bool(hf["qkv_bias"])
        return fields

    # -- writing config.json -------------------------------------------------------------------

    def check_layers(self, config: GPTConfig) -> None:
        """Layers may differ only in their feed-forward: experts (one setting) or a dense gated
        MLP without biases (one setting, where the family has dense layers)."""
        block = config.layers.block
        for index, settings in enumerate(config.layers.layers()):
            if _beside_feed_forward(settings) != _beside_feed_forward(block):
                raise UnsupportedExport(
                    f"{self.export_class} cannot express this zoo model: layer {index} differs "
                    "from the base block beyond its feed-forward (layers.overrides)"
                )
        experts = {ff for ff in self._feed_forwards(config) if isinstance(ff, MoESettings)}
        dense = {ff for ff in self._feed_forwards(config) if isinstance(ff, FeedForwardSettings)}
        if not experts:
            raise UnsupportedExport(f"{self.export_class} is a mixture of experts: feed_forward")
        if len(experts) > 1 or len(dense) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one setting of the experts and one of the dense MLP, "
                f"but this model's layers have {len(experts)} and {len(dense)}"
            )
        if dense and not self.has_dense_layers:
            layers = [i for i, routed in enumerate(routed_layers(config)) if not routed]
            raise UnsupportedExport(
                f"{self.export_class} routes every layer; layers {layers} are dense "
                "(layers.overrides with a dense feed_forward)"
            )
        for feed_forward in dense:
            if feed_forward.kind != "gated" or feed_forward.bias:
                raise UnsupportedExport(
                    f"{self.export_class}'s dense layers have a gated MLP without biases, but "
                    f"this model's are {feed_forward}"
                )
        activations = {ff.activation for ff in experts | dense}
        if len(activations) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one hidden_act for the experts and the dense MLP, but "
                f"this model's are {sorted(activations)}"
            )

    def _feed_forwards(self, config: GPTConfig) -> list[FeedForwardSettings | MoESettings]:
        return [settings.feed_forward for settings in config.layers.layers()]

    def _experts(self, config: GPTConfig) -> MoESettings:
        """The experts' settings (one for every routed layer, `check_layers`)."""
        experts = config.experts()
        if experts is None:
            raise UnsupportedExport(f"{self.export_class} is a mixture of experts: feed_forward")
        return experts

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        experts = self._experts(config)
        if experts.router != "softmax":
            raise UnsupportedExport(
                f"{self.export_class} routes by a softmax: feed_forward.router={experts.router!r}"
            )
        if self.has_shared_expert and not (experts.shared_d_ff and experts.shared_gate):
            raise UnsupportedExport(
                f"{self.export_class} has a gated shared expert: feed_forward.shared_d_ff="
                f"{experts.shared_d_ff}, feed_forward.shared_gate={experts.shared_gate}"
            )
        if not self.has_shared_expert and experts.shared_d_ff:
            raise UnsupportedExport(
                f"{self.export_class} has no shared expert: "
                f"feed_forward.shared_d_ff={experts.shared_d_ff}"
            )
        if self.always_renormalise and not experts.normalize_top_k:
            raise UnsupportedExport(
                f"{self.export_class} always renormalises: feed_forward.normalize_top_k"
            )
        out = super().hf_config(config)
        out.update(
            num_experts_per_tok=experts.top_k,
            router_aux_loss_coef=experts.aux_loss_coef,
            output_router_logits=False,
        )
        out[self.experts_option] = experts.num_experts
        out[self.width_option] = experts.d_ff
        if self.name == "mixtral":
            out["router_jitter_noise"] = 0.0
        else:
            out["norm_topk_prob"] = experts.normalize_top_k
        if self.has_dense_layers:
            out.update(_sparse_layers(routed_layers(config)))
            for feed_forward in self._feed_forwards(config):
                if isinstance(feed_forward, FeedForwardSettings):  # the dense layers' width
                    out["intermediate_size"] = feed_forward.d_ff
        if self.has_shared_expert:
            out["shared_expert_intermediate_size"] = experts.shared_d_ff
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
        layers = config.layers.layers()
        routed = {
            i: settings.feed_forward
            for i, settings in enumerate(layers)
            if isinstance(settings.feed_forward, MoESettings)
        }
        sparse = tuple(f"layers.{i}.feed_forward." for i in routed)
        rules = [r for r in dense.rules if not any(z.startswith(sparse) for z in r.zoo)]
        for i, experts in routed.items():
            hf, zoo = f"model.layers.{i}.{self.moe_prefix}.", f"layers.{i}.feed_forward."
            rules.append(rule(f"{hf}gate.weight", f"{zoo}router.weight"))
            for hf_name, zoo_name in zip(self.projections, ("gate", "up", "down"), strict=True):
                keys = tuple(
                    f"{hf}experts.{e}.{hf_name}.weight" for e in range(experts.num_experts)
                )
                rules.append(Rule(keys, (f"{zoo}experts.{zoo_name}",), STACKED_EXPERTS))
            if experts.shared_d_ff:
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
                if experts.shared_gate:
                    rules.append(rule(f"{hf}shared_expert_gate.weight", f"{zoo}shared_gate.weight"))
        return KeyMap(rules, dense.derived, dense.ignore)


def routed_layers(config: GPTConfig) -> tuple[bool, ...]:
    """Whether each layer routes its tokens to experts (else its MLP is dense)."""
    return tuple(isinstance(s.feed_forward, MoESettings) for s in config.layers.layers())


def _sparse_layers(routed: tuple[bool, ...]) -> dict[str, object]:
    """Qwen's `decoder_sparse_step` and `mlp_only_layers` for the routed layers: the largest
    step whose layers hold every routed one, and the dense layers on that step listed."""
    step = math.gcd(*(i + 1 for i, routes in enumerate(routed) if routes))
    listed = [i for i, routes in enumerate(routed) if not routes and (i + 1) % step == 0]
    return dict(decoder_sparse_step=step, mlp_only_layers=listed)


def _beside_feed_forward(settings: BlockSettings) -> BlockSettings:
    """`settings` with the feed-forward left out of the comparison (a fixed placeholder)."""
    return dataclasses.replace(settings, feed_forward=FeedForwardSettings())


class Mixtral(MoEFamily, Mistral):
    name = "mixtral"
    model_type = "mixtral"
    loads = ("MixtralForCausalLM", "MixtralModel")
    export_class = "MixtralForCausalLM"
    config_class = "MixtralConfig"
    zoo_base = MIXTRAL
    moe_prefix = "block_sparse_moe"
    projections = ("w1", "w3", "w2")
    experts_option = "num_local_experts"
    width_option = "intermediate_size"
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
    zoo_base = QWEN2_MOE
    has_shared_expert = True
    has_dense_layers = True
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
        out["qkv_bias"] = config.layers.block.attention.qkv_bias
        return out


class Qwen3MoE(MoEFamily, Qwen3):
    name = "qwen3_moe"
    model_type = "qwen3_moe"
    loads = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")
    export_class = "Qwen3MoeForCausalLM"
    config_class = "Qwen3MoeConfig"
    zoo_base = QWEN3_MOE
    has_dense_layers = True
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
    zoo_base = OLMOE
    width_option = "intermediate_size"
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
    experts = config.experts()
    qk_norm = config.layers.block.attention.qk_norm
    if experts is not None and experts.shared_d_ff:
        return qwen2_moe
    if qk_norm is not None and qk_norm.scope == "projection":
        return olmoe
    if qk_norm is not None:
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
