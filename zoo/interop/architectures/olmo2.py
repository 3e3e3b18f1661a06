"""OLMo 2 (`Olmo2ForCausalLM`, `Olmo2Model`) <-> `zoo.GPT`.

A Llama-shaped decoder (rotary positions, SwiGLU, grouped-query attention) with two parts set
differently, each a zoo config field:

- the norms sit on each sub-layer's output, before the residual sum, and none before it
  (`x + norm(attention(x))`): `norm_first=False, output_norm=True`, whose one norm per
  sub-layer is that output norm (`post_attention_layernorm`, `post_feedforward_layernorm`);
- QK-norm over the whole query and key projections, all heads at once, before the heads are
  split: `qk_norm=True, qk_norm_scope="projection"`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from zoo.interop.architecture import HFConfig, UnsupportedExport, require_fields
from zoo.interop.architectures.llama import LlamaFamily, biases
from zoo.interop.rules import KeyMap, Shape, rule
from zoo.models import GPTConfig


class Olmo2(LlamaFamily):
    name = "olmo2"
    model_type = "olmo2"
    loads = ("Olmo2ForCausalLM", "Olmo2Model")
    export_class = "Olmo2ForCausalLM"
    config_class = "Olmo2Config"
    has_qk_norm = True
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=50304,
        pad_token_id=1,
        bos_token_id=None,
        eos_token_id=50279,
        rms_norm_eps=1e-5,
    )

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        if hf["mlp_bias"]:
            hf.refuse("mlp_bias", "OLMo 2's MLP has no biases")
        fields = super().zoo_fields(hf, shapes)
        fields.update(norm_first=False, output_norm=True, qk_norm=True, qk_norm_scope="projection")
        return fields

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        require_fields(
            config,
            self.export_class,
            norm_first=False,
            output_norm=True,
            qk_norm_scope="projection",
            norm_weight_offset=0.0,
        )
        if biases(config)[2]:
            raise UnsupportedExport(f"{self.export_class} has no feed-forward biases")
        # Llama's writer checks the rest; it expects Llama's norm placement
        out = super().hf_config(config.replace(norm_first=True, output_norm=False))
        return out

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        llama = super().key_map(config, shapes)
        renamed = {
            ".post_attention_layernorm.weight": ".post_feedforward_layernorm.weight",
            ".input_layernorm.weight": ".post_attention_layernorm.weight",
        }
        rules = []
        for one in llama.rules:
            (hf_key,) = one.hf[:1]
            for old, new in renamed.items():
                if hf_key.endswith(old):
                    hf_key = hf_key[: -len(old)] + new
                    break
            rules.append(rule(hf_key, one.zoo[0], one.transform, aliases=one.aliases))
        return KeyMap(rules, ignore=llama.ignore)


OLMO2 = Olmo2()

__all__ = ["OLMO2", "Olmo2"]
