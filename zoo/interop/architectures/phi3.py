"""Phi-3, Phi-3.5 and Phi-4-mini (`Phi3ForCausalLM`, `Phi3Model`) <-> `zoo.GPT`.

Llama's layout with three differences:

- the checkpoint fuses the query, key and value projections into one `qkv_proj` (rows: the
  queries, then the keys, then the values; fewer key/value rows under grouped-query attention)
  and the gate and up projections into one `gate_up_proj` (the gate's rows first): loading
  splits them into zoo's separate layers, exporting fuses them again;
- LongRoPE (`rope_scaling` of type `longrope`, or the older `su`): per-frequency short and long
  factors around `original_max_position_embeddings` (a top-level field), with cos and sin
  scaled by the attention factor (`zoo.nn.Rope(scaling="longrope")`);
- `partial_rotary_factor` (Phi-4-mini: 0.75): only the first part of each head rotates.

Phi-3-mini-4k's `sliding_window` (2047) is the Mistral-style window on every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from zoo.interop.architecture import ConfigFields, HFConfig, UnsupportedExport
from zoo.interop.architectures.llama import LlamaFamily, biases
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, Transform, rule
from zoo.models import GPTConfig
from zoo.nn.rotary import Rope
from zoo.presets import parts


def fused_rows(sizes: tuple[int, ...], what: str) -> Transform:
    """One HF weight whose rows are several zoo Linear weights of `sizes` rows, in order."""
    cuts = np.cumsum(sizes)[:-1]

    def hf_shapes(shapes: list[Shape]) -> list[Shape]:
        return [(sum(shape[0] for shape in shapes), shapes[0][1])]

    return Transform(
        what,
        lambda arrays: list(np.split(arrays[0], cuts, axis=0)),
        lambda arrays: [np.concatenate(arrays, axis=0)],
        hf_shapes,
    )


class Phi3(LlamaFamily):
    name = "phi3"
    model_type = "phi3"
    loads = ("Phi3ForCausalLM", "Phi3Model")
    export_class = "Phi3ForCausalLM"
    config_class = "Phi3Config"
    zoo_base = parts.with_parts(parts.LLAMA, parts.PHI3)
    has_attention_bias_option = False
    window_option = "mistral"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=32000,
        pad_token_id=32000,
        sliding_window=None,
        partial_rotary_factor=1.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )

    def _rope(self, hf: HFConfig) -> ConfigFields:
        scaling = hf["rope_parameters"] or hf["rope_scaling"] or {}
        params: dict[str, Any] = {
            "rope_theta": hf["rope_theta"] or 10000.0,
            "partial_rotary_factor": hf["partial_rotary_factor"] or 1.0,
            "original_max_position_embeddings": hf["original_max_position_embeddings"],
            "max_position_embeddings": hf["max_position_embeddings"],
            **scaling,
        }
        if params.get("type") == "yarn" or params.get("rope_type") == "yarn":
            params["rope_type"] = "longrope"  # transformers reads Phi-3's old "yarn" so too
        try:
            rope = Rope.from_hf(params)
        except (ValueError, KeyError) as error:
            hf.refuse("rope_scaling", str(error))
        return {"attention.rope": rope}

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        fields = super().zoo_fields(hf, shapes)
        # the residual and embedding dropouts only train; they are kept where they apply
        del fields["dropout"]
        fields.update(
            {
                "embedder.dropout": float(hf["embd_pdrop"] or 0.0),
                "layers.block.dropout": float(hf["resid_pdrop"] or 0.0),
                "feed_forward.dropout": 0.0,
            }
        )
        return fields

    def hf_config(self, config: GPTConfig) -> HFDict:
        rope = config.layers.block.attention.rope
        if rope is None:
            raise UnsupportedExport(
                f"{self.export_class} rotates queries and keys: attention.rope=None (set a Rope)"
            )
        if rope.scaling not in (None, "longrope"):
            raise UnsupportedExport(
                f"{self.export_class} has no {rope.scaling} rope scaling: attention.rope.scaling"
            )
        # Llama's writer checks the rest; Phi-3 writes its own rotary fields and dropouts
        plain = {
            "attention.rope": Rope(theta=rope.theta),
            "embedder.dropout": 0.0,
            "layers.block.dropout": 0.0,
        }
        out = super().hf_config(config.replace(**plain))
        _, scaling = rope.to_hf()
        out.update(
            rope_scaling=scaling,
            partial_rotary_factor=rope.partial_rotary_factor,
            original_max_position_embeddings=(
                rope.original_max_positions if rope.scaling == "longrope" else config.max_positions
            ),
            resid_pdrop=config.layers.block.dropout,
            embd_pdrop=config.embedder.dropout,
        )
        return out

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        qkv_bias, out_bias, mlp_bias = biases(config)
        if qkv_bias or out_bias or mlp_bias:
            raise UnsupportedExport("Phi3ForCausalLM has no biases")
        head_dim = config.head_dim
        qkv = fused_rows(
            (config.num_heads * head_dim, config.kv_heads * head_dim, config.kv_heads * head_dim),
            "fused query/key/value rows",
        )
        d_ff = config.layers.block.feed_forward.d_ff
        gate_up = fused_rows((d_ff, d_ff), "fused gate/up rows")
        tie = config.head.tie
        tied = ("lm_head.weight",) if tie else ()
        rules = [rule("model.embed_tokens.weight", "embedder.token_weight", aliases=tied)]
        for i in range(config.num_layers):
            hf, zoo = f"model.layers.{i}.", f"layers.{i}."
            attention = f"{zoo}self_attention."
            rules += [
                rule(f"{hf}input_layernorm.weight", f"{zoo}self_attention_norm.weight"),
                rule(f"{hf}post_attention_layernorm.weight", f"{zoo}feed_forward_norm.weight"),
                Rule(
                    (f"{hf}self_attn.qkv_proj.weight",),
                    tuple(f"{attention}{name}_proj.weight" for name in ("query", "key", "value")),
                    qkv,
                ),
                rule(f"{hf}self_attn.o_proj.weight", f"{attention}output_proj.weight"),
                Rule(
                    (f"{hf}mlp.gate_up_proj.weight",),
                    (f"{zoo}feed_forward.gate.weight", f"{zoo}feed_forward.hidden.weight"),
                    gate_up,
                ),
                rule(f"{hf}mlp.down_proj.weight", f"{zoo}feed_forward.output.weight"),
            ]
        rules.append(rule("model.norm.weight", "final_norm.weight"))
        if not tie:
            rules.append(rule("lm_head.weight", "head.weight"))
        return KeyMap(rules, ignore=(r"model\.rotary_emb\..*",))


PHI3 = Phi3()

__all__ = ["PHI3", "Phi3", "fused_rows"]
