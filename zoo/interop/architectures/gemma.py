"""Gemma 2 and Gemma 3 text (`Gemma2ForCausalLM`, `Gemma3ForCausalLM`) <-> `zoo.GPT`.

Both are Llama-shaped decoders with these parts set differently, each a setting of the
config's tree (`zoo.presets.parts.GEMMA2`, `GEMMA3`):

| Gemma part                                    | zoo setting                                |
| --------------------------------------------- | ------------------------------------------ |
| embeddings times sqrt(hidden_size)            | `embedder.scale=True`                      |
| RMSNorm by `1 + weight` (stored weight - 1)   | `norm.weight_offset=1.0`                   |
| a norm before and after attention and MLP     | `output_norm=True` with `norm_first=True`  |
| GeGLU with tanh GELU                          | `feed_forward` gated, `gelu_tanh`          |
| scores times `query_pre_attn_scalar ** -0.5`  | `attention.scale_dim`                      |
| `attn_logit_softcapping` (Gemma 2)            | `attention.softcap`                        |
| `final_logit_softcapping` (Gemma 2)           | `head.softcap`                             |
| sliding and full layers (`layer_types`)       | `attention.window` on the base block, an   |
|                                               | override `attention.window=None` on the    |
|                                               | full layers (`layers.overrides`)           |
| local rotary base (Gemma 3)                   | the base block's `attention.rope`, the     |
|                                               | full layers' `rope` in their override      |
| QK-norm per head (Gemma 3)                    | `attention.qk_norm` (by `1 + weight`)      |

The norms' weights copy unchanged: zoo's RMSNorm adds the 1 itself. Gemma 2 alternates
sliding and full layers (sliding first); Gemma 3 has five sliding layers to one full one
(`sliding_window_pattern=6`), unless the config lists `layer_types`. Config files come in the
hub's spelling (`rope_theta`, `rope_scaling`, `rope_local_base_freq`) and transformers 5's
(`rope_parameters`, for Gemma 3 one dict per layer type); both are read. On export the layers'
resolved settings (`config.layers.layers()`) give `layer_types`; layers that differ in
anything but their window and rotary base are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from zoo.interop.architecture import (
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    require_fields,
)
from zoo.interop.architectures.llama import LLAMA_DEFAULTS, LlamaFamily
from zoo.interop.rules import KeyMap, Shape, rule
from zoo.models import GPTConfig
from zoo.models.gpt import LMHead
from zoo.nn.block import BlockSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.multihead import AttentionSettings, QKNorm
from zoo.nn.plan import LayerOverride, weights_of
from zoo.nn.rotary import Rope
from zoo.presets.parts import GEMMA2, GEMMA3, LLAMA, with_parts

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


def override_of(
    changes: Mapping[str, object], layers: Sequence[int], num_layers: int
) -> LayerOverride:
    """The `LayerOverride` of `changes` on `layers` (increasing) of a `num_layers` stack: on
    every step-th layer from the first where they are that (Gemma's patterns), which holds
    when the number of layers changes, else on the layers listed."""
    start = layers[0]
    step = layers[1] - start if len(layers) > 1 else start + 1
    if tuple(range(start, num_layers, step)) == tuple(layers):
        return LayerOverride(changes=changes, start=start, step=step)
    return LayerOverride(changes=changes, layers=tuple(layers))


class GemmaFamily(LlamaFamily):
    """What Gemma 2 and Gemma 3 share; the subclasses set their names and switches."""

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

    def _ropes(self, hf: HFConfig) -> tuple[Rope, Rope]:
        """The full layers' `Rope` and the sliding layers', from either spelling."""
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
            full = Rope.from_hf(params)
        except ValueError as error:
            hf.refuse("rope_scaling", str(error))
        local = full if local_theta is None else Rope(theta=float(local_theta))
        return full, local

    def _windows(self, hf: HFConfig, num_layers: int) -> ConfigFields:
        return {}  # Gemma's windows come with its rotary bases, per layer (`_rope`)

    def _rope(self, hf: HFConfig) -> ConfigFields:
        """The sliding layers' window and rotary base on the base block, and an override that
        makes the full layers attend to every position with their own base."""
        num_layers = hf["num_hidden_layers"]
        types = self._layer_types(hf, num_layers)
        full_rope, local_rope = self._ropes(hf)
        window = hf["sliding_window"]
        full = [i for i, kind in enumerate(types) if kind == FULL]
        fields: ConfigFields = {"layers.overrides": ()}
        if window is None or len(full) == num_layers:  # every layer full
            return {**fields, "attention.window": None, "attention.rope": full_rope}
        fields.update({"attention.window": int(window), "attention.rope": local_rope})
        if full:
            changes: dict[str, object] = {"attention.window": None}
            if full_rope != local_rope:
                changes["attention.rope"] = full_rope
            fields["layers.overrides"] = (override_of(changes, full, num_layers),)
        return fields

    def _qk_norm(self, eps: float) -> QKNorm | None:
        """Gemma 3's per-head RMSNorm scales by `1 + weight`, as its other norms."""
        return QKNorm(eps=eps, weight_offset=1.0) if self.has_qk_norm else None

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        """Llama's fields (with Gemma's windows, rotary bases and activation field), then the
        parts Gemma sets differently."""
        if hf["use_bidirectional_attention"]:
            hf.refuse("use_bidirectional_attention", "zoo.GPT attends causally")
        if hf["hidden_act"] not in (None, hf["hidden_activation"]):
            hf.refuse("hidden_act", "Gemma's MLP uses hidden_activation; the two differ")
        fields = super().zoo_fields(hf, shapes)
        fields.update(
            {
                "output_norm": True,
                "norm.weight_offset": 1.0,
                "embedder.scale": True,
                "feed_forward.bias": False,  # Gemma's configs have no mlp_bias
                "attention.scale_dim": float(hf["query_pre_attn_scalar"]),
                "attention.softcap": _number(hf["attn_logit_softcapping"]),
                "head": LMHead(
                    tie=bool(hf["tie_word_embeddings"]),
                    softcap=_number(hf["final_logit_softcapping"]),
                ),
            }
        )
        return fields

    # -- writing config.json -------------------------------------------------------------------

    def export_parts(self, config: GPTConfig) -> ConfigFields:
        """The settings Gemma's config.json cannot change."""
        return {
            "embedder.positions": "none",
            "embedder.norm": None,
            "embedder.scale": True,
            "norm.kind": "rmsnorm",
            "norm.weight_offset": 1.0,
            "norm_first": True,
            "output_norm": True,
            "attention_norm": True,
            "attention.qk_norm": self._qk_norm(config.layers.block.norm.eps),
        }

    def hf_config(self, config: GPTConfig) -> dict[str, Any]:
        require_fields(config, self.export_class, self.export_parts(config))
        block = config.layers.block
        attention, dense = block.attention, block.feed_forward
        if not isinstance(dense, FeedForwardSettings) or dense.kind != "gated" or dense.bias:
            raise UnsupportedExport(
                f"{self.export_class} has a gated MLP without biases in every layer, but this "
                f"model's feed_forward is {dense}"
            )
        if attention.qkv_bias != attention.output_bias:
            raise UnsupportedExport(
                f"{self.export_class} has one attention_bias for q/k/v and o, but this model has "
                f"attention.qkv_bias={attention.qkv_bias}, "
                f"attention.output_bias={attention.output_bias}"
            )
        scalar = attention.scale_dim
        return dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=dense.d_ff,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.head_dim,
            hidden_activation=_gemma_activation(config),
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            rms_norm_eps=block.norm.eps,
            tie_word_embeddings=config.head.tie,
            attention_bias=attention.qkv_bias,
            attention_dropout=attention.dropout,
            query_pre_attn_scalar=config.head_dim if scalar is None else _plain(scalar),
            attn_logit_softcapping=attention.softcap,
            final_logit_softcapping=config.head.softcap,
            bos_token_id=config.bos_id,
            eos_token_id=list(config.end_ids) if config.stop_ids else config.eos_id,
            pad_token_id=config.pad_id,
            **self._export_layers(config),
        )

    def _export_layers(self, config: GPTConfig) -> dict[str, Any]:
        """`layer_types`, `sliding_window` and the rotary bases, from each layer's settings."""
        layers = config.layers.layers()
        for index, settings in enumerate(layers):
            if weights_of(settings) != weights_of(config.layers.block):
                raise UnsupportedExport(
                    f"{self.export_class} cannot express this zoo model: layer {index} differs "
                    "from the base block beyond its window and rotary base (layers.overrides)"
                )
        sliding = [s.attention for s in layers if s.attention.window is not None]
        full = [s.attention for s in layers if s.attention.window is None]
        windows = sorted({window for a in sliding if (window := a.window) is not None})
        if len(windows) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one sliding_window, but the layers' are {windows}"
            )
        full_rope = self._one_rope(full, "full")
        local_rope = self._one_rope(sliding, "sliding")
        full_rope = full_rope or local_rope
        local_rope = local_rope or full_rope
        assert full_rope is not None and local_rope is not None
        if local_rope != full_rope:
            if not self.local_rope:
                raise UnsupportedExport(f"{self.export_class} has one rotary base for every layer")
            if local_rope != Rope(theta=local_rope.theta):
                raise UnsupportedExport(
                    f"{self.export_class}'s sliding layers rotate by plain RoPE of their own base "
                    f"(rope_local_base_freq), but this model's rotate by {local_rope}"
                )
        theta, scaling = full_rope.to_hf()
        out: dict[str, Any] = dict(rope_theta=theta, rope_scaling=scaling)
        if self.local_rope:
            out["rope_local_base_freq"] = local_rope.theta
        if not sliding:
            # every layer full: a window as long as the context never cuts anything
            out.update(sliding_window=config.max_positions, layer_types=[FULL] * len(layers))
            return out
        types = [SLIDING if s.attention.window is not None else FULL for s in layers]
        out.update(sliding_window=windows[0], layer_types=types)
        return out

    def _one_rope(self, attentions: list[AttentionSettings], kind: str) -> Rope | None:
        """The one rotary setting of the `kind` layers (None when there are none)."""
        ropes = {a.rope for a in attentions}
        if None in ropes:
            raise UnsupportedExport(f"{self.export_class} rotates queries and keys: attention.rope")
        if len(ropes) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one rotary setting for the {kind} layers, but this "
                f"model's {kind} layers have {len(ropes)}"
            )
        return ropes.pop() if ropes else None

    # -- weights -------------------------------------------------------------------------------

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        tied = ("lm_head.weight",) if config.head.tie else ()
        rules = [rule("model.embed_tokens.weight", "embedder.token_weight", aliases=tied)]
        for i, settings in enumerate(config.layers.layers()):
            hf, zoo = f"model.layers.{i}.", f"layers.{i}."
            for hf_name, zoo_name, has_bias in _layer_names(settings):
                rules.append(rule(f"{hf}{hf_name}.weight", f"{zoo}{zoo_name}.weight"))
                if has_bias:
                    rules.append(rule(f"{hf}{hf_name}.bias", f"{zoo}{zoo_name}.bias"))
        rules.append(rule("model.norm.weight", "final_norm.weight"))
        if not config.head.tie:
            rules.append(rule("lm_head.weight", "head.weight"))
        return KeyMap(rules, ignore=(r"model\.rotary_emb\..*",))


def _layer_names(settings: BlockSettings) -> list[tuple[str, str, bool]]:
    """(HF name, zoo name, has a bias) of each weight of one Gemma layer."""
    bias = settings.attention.qkv_bias
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
    if settings.attention.qk_norm is not None:
        names += [
            ("self_attn.q_norm", "self_attention.query_norm", False),
            ("self_attn.k_norm", "self_attention.key_norm", False),
        ]
    return names


def _number(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _plain(value: float) -> int | float:
    """An integral float as an int, as the hub writes `query_pre_attn_scalar`."""
    return int(value) if float(value).is_integer() else value


def _gemma_activation(config: GPTConfig) -> str:
    """Gemma's configs name the tanh GELU `gelu_pytorch_tanh`."""
    activation = config.layers.block.feed_forward.activation
    return "gelu_pytorch_tanh" if activation == "gelu_tanh" else export_activation(config)


class Gemma2(GemmaFamily):
    name = "gemma2"
    model_type = "gemma2"
    loads = ("Gemma2ForCausalLM", "Gemma2Model")
    export_class = "Gemma2ForCausalLM"
    config_class = "Gemma2Config"
    zoo_base = with_parts(LLAMA, GEMMA2)


class Gemma3Text(GemmaFamily):
    name = "gemma3_text"
    model_type = "gemma3_text"
    loads = ("Gemma3ForCausalLM", "Gemma3TextModel")
    export_class = "Gemma3ForCausalLM"
    config_class = "Gemma3TextConfig"
    zoo_base = with_parts(LLAMA, GEMMA3)
    has_qk_norm = True
    local_rope = True
    default_pattern = 6
    extra_defaults: ClassVar[dict[str, Any]] = GEMMA3_DEFAULTS


GEMMA_FAMILIES = (Gemma2(), Gemma3Text())


def gemma_family_for(config: GPTConfig) -> GemmaFamily:
    """Gemma 3 where the model has QK-norm, else Gemma 2."""
    has_qk_norm = config.layers.block.attention.qk_norm is not None
    return GEMMA_FAMILIES[1] if has_qk_norm else GEMMA_FAMILIES[0]


__all__ = ["GEMMA_FAMILIES", "Gemma2", "Gemma3Text", "GemmaFamily", "gemma_family_for"]
