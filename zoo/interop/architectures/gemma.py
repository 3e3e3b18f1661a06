"""Gemma 2 and Gemma 3 text (`Gemma2ForCausalLM`, `Gemma3ForCausalLM`) <-> `zoo.GPT`.

Both are Llama-shaped decoders with these parts set differently, each a zoo config field:

| Gemma part                                    | zoo field                                  |
| --------------------------------------------- | ------------------------------------------ |
| embeddings times sqrt(hidden_size)            | `scale_embeddings=True`                    |
| RMSNorm by `1 + weight` (stored weight - 1)   | `norm_weight_offset=1.0`                   |
| a norm before and after attention and MLP     | `output_norm=True` with `norm_first=True`  |
| GeGLU with tanh GELU                          | `feed_forward="gated"`, `gelu_tanh`        |
| scores times `query_pre_attn_scalar ** -0.5`  | `query_pre_attn_scalar`                    |
| `attn_logit_softcapping` (Gemma 2)            | `attention_softcap`                        |
| `final_logit_softcapping` (Gemma 2)           | `final_logit_softcap`                      |
| sliding and full layers (`layer_types`)       | `sliding_window` + `global_layers`         |
| local rotary base (Gemma 3)                   | `local_rope_theta`                         |
| QK-norm per head (Gemma 3)                    | `qk_norm=True`                             |

The norms' weights copy unchanged: zoo's RMSNorm adds the 1 itself. Gemma 2 alternates
sliding and full layers (sliding first); Gemma 3 has five sliding layers to one full one
(`sliding_window_pattern=6`), unless the config lists `layer_types`. Config files come in the
hub's spelling (`rope_theta`, `rope_scaling`, `rope_local_base_freq`) and transformers 5's
(`rope_parameters`, for Gemma 3 one dict per layer type); both are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from zoo.interop.architecture import (
    HFConfig,
    UnsupportedExport,
    export_activation,
    require_fields,
)
from zoo.interop.architectures.llama import LLAMA_DEFAULTS, LlamaFamily, biases
from zoo.interop.rules import KeyMap, Shape, rule
from zoo.models import GPTConfig
from zoo.nn.rotary import Rope

SLIDING, FULL = "sliding_attention", "full_attention"

GEMMA2_DEFAULTS: dict[str, Any] = dict(
    LLAMA_DEFAULTS,
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_act=None,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=8192,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    tie_word_embeddings=True,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    layer_types=None,
    final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0,
    use_bidirectional_attention=None,
    rope_parameters=None,
)
GEMMA3_DEFAULTS: dict[str, Any] = dict(
    GEMMA2_DEFAULTS,
    vocab_size=262208,
    max_position_embeddings=131072,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
    sliding_window_pattern=6,
)


class GemmaFamily(LlamaFamily):
    """What Gemma 2 and Gemma 3 share; the subclasses set their names and switches."""

    has_qk_norm = False  # Gemma 3
    local_rope = False  # Gemma 3: the sliding layers rotate by rope_local_base_freq
    default_pattern = 2  # every n-th layer is a full one (layer_types overrides)
    activation_option = "hidden_activation"
    extra_defaults: ClassVar[dict[str, Any]] = GEMMA2_DEFAULTS

    def hf_defaults(self) -> dict[str, Any]:
        return dict(self.extra_defaults)

    # -- reading config.json ------------------------------------------------------------------

    def _layer_types(self, hf: HFConfig, num_layers: int) -> list[str]:
        types = hf["layer_types"]
        if types is None:
            every = hf["sliding_window_pattern"] or self.default_pattern
            types = [FULL if (i + 1) % every == 0 else SLIDING for i in range(num_layers)]
        if len(types) != num_layers or set(types) - {SLIDING, FULL}:
            hf.refuse("layer_types", f"needs {num_layers} of {SLIDING!r} and {FULL!r}")
        return list(types)

    def _windows(self, hf: HFConfig, num_layers: int) -> dict[str, Any]:
        types = self._layer_types(hf, num_layers)
        window = hf["sliding_window"]
        if SLIDING not in types or window is None:
            return dict(sliding_window=None, global_layers=None)
        full = tuple(i for i, kind in enumerate(types) if kind == FULL)
        return dict(sliding_window=int(window), global_layers=full or None)

    def _rope(self, hf: HFConfig) -> dict[str, Any]:
        """The full layers' `Rope` and the sliding layers' base, from either spelling."""
        params = hf["rope_parameters"]
        local_theta = hf["rope_local_base_freq"] if self.local_rope else None
        if isinstance(params, Mapping) and FULL in params:  # transformers 5, Gemma 3
            sliding = params.get(SLIDING) or {}
            if sliding.get("rope_type", "default") != "default":
                hf.refuse("rope_parameters", "the sliding layers' rotary is plain RoPE in zoo")
            local_theta = sliding.get("rope_theta", local_theta)
            params = dict(params[FULL])
        elif params is None:
            params = dict(hf["rope_scaling"] or {})
        params = {"rope_theta": hf["rope_theta"] or 10000.0, **params}
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            hf.refuse("rope_parameters", "Gemma rotates the whole head")
        try:
            rope = Rope.from_hf(params)
        except ValueError as error:
            hf.refuse("rope_scaling", str(error))
        theta = None if local_theta is None else float(local_theta)
        return dict(positions="rotary", rope=rope, local_rope_theta=theta)

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        """Llama's fields (with Gemma's windows, rotary bases and activation field), then the
        parts Gemma sets differently."""
        if hf["use_bidirectional_attention"]:
            hf.refuse("use_bidirectional_attention", "zoo.GPT attends causally")
        if hf["hidden_act"] not in (None, hf["hidden_activation"]):
            hf.refuse("hidden_act", "Gemma's MLP uses hidden_activation; the two differ")
        fields = super().zoo_fields(hf, shapes)
        if fields["global_layers"] is None:
            fields["local_rope_theta"] = None  # every layer full or every layer sliding
            if fields["sliding_window"] is not None and self.local_rope:
                fields["rope"] = Rope(theta=float(hf["rope_local_base_freq"]))
        fields.update(
            output_norm=True,
            norm_weight_offset=1.0,
            scale_embeddings=True,
            feed_forward_bias=False,  # Gemma's configs have no mlp_bias
            query_pre_attn_scalar=float(hf["query_pre_attn_scalar"]),
            attention_softcap=_number(hf["attn_logit_softcapping"]),
            final_logit_softcap=_number(hf["final_logit_softcapping"]),
        )
        return fields

    # -- writing config.json -------------------------------------------------------------------

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        require_fields(
            config,
            self.export_class,
            norm="rmsnorm",
            norm_first=True,
            output_norm=True,
            norm_weight_offset=1.0,
            positions="rotary",
            feed_forward="gated",
            qk_norm=self.has_qk_norm,
            qk_norm_scope="head",
            embedding_norm=False,
            scale_embeddings=True,
        )
        qkv_bias, out_bias, mlp_bias = biases(config)
        if qkv_bias != out_bias or mlp_bias:
            raise UnsupportedExport(
                f"{self.export_class} has one attention_bias for q/k/v and o and no MLP bias, "
                f"but this model has qkv_bias={qkv_bias}, attention_output_bias={out_bias}, "
                f"feed_forward_bias={mlp_bias}"
            )
        if config.local_rope_theta is not None and not self.local_rope:
            raise UnsupportedExport(f"{self.export_class} has one rotary base for every layer")
        theta, scaling = config.rope.to_hf()
        scalar = config.query_pre_attn_scalar
        out: dict[str, Any] = dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=config.d_ff,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.head_dim,
            hidden_activation=_gemma_activation(config),
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            rms_norm_eps=config.layer_norm_eps,
            tie_word_embeddings=config.tie_embeddings,
            attention_bias=bool(qkv_bias),
            attention_dropout=config.attention_dropout,
            query_pre_attn_scalar=config.head_dim if scalar is None else _plain(scalar),
            attn_logit_softcapping=config.attention_softcap,
            final_logit_softcapping=config.final_logit_softcap,
            bos_token_id=config.bos_id,
            eos_token_id=list(config.end_ids) if config.stop_ids else config.eos_id,
            pad_token_id=config.pad_id,
            rope_theta=theta,
            rope_scaling=scaling,
            **self._export_layers(config),
        )
        if self.local_rope:
            local = config.local_rope_theta
            out["rope_local_base_freq"] = theta if local is None else local
        return out

    def _export_layers(self, config: GPTConfig) -> dict[str, Any]:
        window, full = config.sliding_window, config.global_layers
        if window is None:
            # every layer full: a window as long as the context never cuts anything
            return dict(sliding_window=config.max_positions, layer_types=[FULL] * config.num_layers)
        types = [FULL if full and i in full else SLIDING for i in range(config.num_layers)]
        return dict(sliding_window=window, layer_types=types)

    # -- weights -------------------------------------------------------------------------------

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        tied = ("lm_head.weight",) if config.tie_embeddings else ()
        rules = [rule("model.embed_tokens.weight", "embedder.token_weight", aliases=tied)]
        bias, _, _ = biases(config)
        names = [
            ("input_layernorm", "self_attention_norm", False),
            ("post_attention_layernorm", "self_attention_output_norm", False),
            ("pre_feedforward_layernorm", "feed_forward_norm", False),
            ("post_feedforward_layernorm", "feed_forward_output_norm", False),
            ("self_attn.q_proj", "self_attention.query_proj", bias),
            ("self_attn.k_proj", "self_attention.key_proj", bias),
            ("self_attn.v_proj", "self_attention.value_proj", bias),
            ("self_attn.o_proj", "self_attention.output_proj", bias),
            ("mlp.gate_proj", "feed_forward.gate", False),
            ("mlp.up_proj", "feed_forward.hidden", False),
            ("mlp.down_proj", "feed_forward.output", False),
        ]
        if config.qk_norm:
            names += [
                ("self_attn.q_norm", "self_attention.query_norm", False),
                ("self_attn.k_norm", "self_attention.key_norm", False),
            ]
        for i in range(config.num_layers):
            hf, zoo = f"model.layers.{i}.", f"layers.{i}."
            for hf_name, zoo_name, has_bias in names:
                rules.append(rule(f"{hf}{hf_name}.weight", f"{zoo}{zoo_name}.weight"))
                if has_bias:
                    rules.append(rule(f"{hf}{hf_name}.bias", f"{zoo}{zoo_name}.bias"))
        rules.append(rule("model.norm.weight", "final_norm.weight"))
        if not config.tie_embeddings:
            rules.append(rule("lm_head.weight", "head.weight"))
        return KeyMap(rules, ignore=(r"model\.rotary_emb\..*",))


def _number(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _plain(value: float) -> int | float:
    """An integral float as an int, as the hub writes `query_pre_attn_scalar`."""
    return int(value) if float(value).is_integer() else value


def _gemma_activation(config: GPTConfig) -> str:
    """Gemma's configs name the tanh GELU `gelu_pytorch_tanh`."""
    return "gelu_pytorch_tanh" if config.activation == "gelu_tanh" else export_activation(config)


class Gemma2(GemmaFamily):
    name = "gemma2"
    model_type = "gemma2"
    loads = ("Gemma2ForCausalLM", "Gemma2Model")
    export_class = "Gemma2ForCausalLM"
    config_class = "Gemma2Config"


class Gemma3Text(GemmaFamily):
    name = "gemma3_text"
    model_type = "gemma3_text"
    loads = ("Gemma3ForCausalLM", "Gemma3TextModel")
    export_class = "Gemma3ForCausalLM"
    config_class = "Gemma3TextConfig"
    has_qk_norm = True
    local_rope = True
    default_pattern = 6
    extra_defaults: ClassVar[dict[str, Any]] = GEMMA3_DEFAULTS


GEMMA_FAMILIES = (Gemma2(), Gemma3Text())


def gemma_family_for(config: GPTConfig) -> GemmaFamily:
    """Gemma 3 where the model has QK-norm, else Gemma 2."""
    return GEMMA_FAMILIES[1] if config.qk_norm else GEMMA_FAMILIES[0]


__all__ = ["GEMMA_FAMILIES", "Gemma2", "Gemma3Text", "GemmaFamily", "gemma_family_for"]
