"""OLMo 2 (`Olmo2ForCausalLM`, `Olmo2Model`) <-> `zoo.GPT`.

A Llama-shaped decoder (rotary positions, SwiGLU, grouped-query attention) with two parts set
differently (`zoo.presets.parts.OLMO2`):

- the norms sit on each sub-layer's output, before the residual sum, and none before it
  (`x + norm(attention(x))`): `norm_first=False, output_norm=True`, whose one norm per
  sub-layer is that output norm (`post_attention_layernorm`, `post_feedforward_layernorm`);
- QK-norm over the whole query and key projections, all heads at once, before the heads are
  split: `attention.qk_norm=QKNorm(scope="projection")`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from zoo.interop.architecture import ConfigFields, HFConfig
from zoo.interop.architectures.llama import LlamaFamily
from zoo.interop.rules import KeyMap, Shape, rule
from zoo.models import GPTConfig
from zoo.presets import parts


class Olmo2(LlamaFamily):
    name = "olmo2"
    model_type = "olmo2"
    loads = ("Olmo2ForCausalLM", "Olmo2Model")
    export_class = "Olmo2ForCausalLM"
    config_class = "Olmo2Config"
    zoo_base = parts.with_parts(parts.LLAMA, parts.OLMO2)
    has_qk_norm = True
    qk_norm_scope = "projection"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=50304,
        pad_token_id=1,
        bos_token_id=None,
        eos_token_id=50279,
        rms_norm_eps=1e-5,
    )

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        if hf["mlp_bias"]:
            hf.refuse("mlp_bias", "OLMo 2's MLP has no biases")
        fields = super().zoo_fields(hf, shapes)
        fields.update(norm_first=False, output_norm=True)
        return fields

    def export_parts(self, config: GPTConfig) -> ConfigFields:
        """Llama's parts with OLMo 2's norm placement."""
        return {**super().export_parts(config), "norm_first": False, "output_norm": True}

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
