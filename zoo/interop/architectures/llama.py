"""Llama, Mistral, Qwen2 and Qwen3 (`*ForCausalLM`, `*Model`) <-> `zoo.GPT`.

The four share one layout: RMSNorm before each sub-layer, rotary positions, a SwiGLU MLP
(`gate_proj`, `up_proj`, `down_proj`) and grouped-query attention with separate `q/k/v/o_proj`
(`zoo.presets.parts.LLAMA`). They differ in a few switches, each a setting of the attention:

| family  | attention biases               | QK-norm | sliding window       |
| ------- | ------------------------------ | ------- | -------------------- |
| llama   | q/k/v/o if `attention_bias`    | no      | no                   |
| mistral | none                           | no      | `sliding_window`     |
| qwen2   | q/k/v always, o never          | no      | only if every layer  |
| qwen3   | q/k/v/o if `attention_bias`    | yes     | only if every layer  |

SmolLM2 checkpoints are `LlamaForCausalLM`. Config files come in two spellings: the hub's
`rope_theta` + `rope_scaling` and transformers 5's `rope_parameters`; both are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    logger,
    refuse_layer_overrides,
    require_fields,
)
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Shape, rule
from zoo.models import GPTConfig
from zoo.models.gpt import LMHead
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.multihead import QKNorm
from zoo.nn.rotary import Rope
from zoo.presets.parts import LLAMA, QWEN2, QWEN3, with_parts

# transformers' LlamaConfig defaults; the other families override a few
LLAMA_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=None,
    head_dim=None,
    hidden_act="silu",
    max_position_embeddings=2048,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    rope_scaling=None,
    attention_bias=False,
    attention_dropout=0.0,
    mlp_bias=False,
    pretraining_tp=1,
)


def biases(config: GPTConfig) -> tuple[bool, bool, bool]:
    """Whether the q/k/v projections, the attention output and the MLP have biases (the base
    block's; experts have none)."""
    block = config.layers.block
    feed_forward = block.feed_forward
    mlp_bias = isinstance(feed_forward, FeedForwardSettings) and feed_forward.bias
    return block.attention.qkv_bias, block.attention.output_bias, mlp_bias


def residual_dropouts(config: GPTConfig) -> dict[str, float]:
    """The dropouts a Llama-style checkpoint has no option for, by path (the nonzero ones)."""
    block = config.layers.block
    rates = {"embedder.dropout": config.embedder.dropout, "dropout": block.dropout}
    if isinstance(block.feed_forward, FeedForwardSettings):
        rates["feed_forward.dropout"] = block.feed_forward.dropout
    return {path: rate for path, rate in rates.items() if rate}


class LlamaFamily(Architecture[GPTConfig]):
    """What the four decoder families share; subclasses set names and their switches."""

    prefix = "model."
    exports_scores = False  # a score head exports to `*ForSequenceClassification`
    zoo_config_class = GPTConfig
    zoo_base = LLAMA
    qkv_bias_always = False  # Qwen2: q/k/v biases whatever the config says, no output bias
    has_attention_bias_option = True  # config.json `attention_bias` (Llama, Qwen3)
    has_mlp_bias_option = False  # config.json `mlp_bias` (Llama, SmolLM3)
    has_qk_norm = False  # Qwen3
    qk_norm_scope = "head"  # each head's queries and keys (Qwen3); OLMo 2: all heads at once
    window_option = "none"  # none | mistral (`sliding_window`) | qwen (`use_sliding_window`)
    activation_option = "hidden_act"  # the config.json field naming the MLP's activation
    extra_defaults: ClassVar[dict[str, Any]] = {}

    def hf_defaults(self) -> dict[str, Any]:
        return {**LLAMA_DEFAULTS, **self.extra_defaults}

    # -- reading config.json ------------------------------------------------------------------

    def _rope(self, hf: HFConfig) -> ConfigFields:
        """The attention's rotary settings, from either spelling."""
        params = hf["rope_parameters"]
        if params is None:
            params = dict(hf["rope_scaling"] or {})
            params.setdefault("rope_theta", hf["rope_theta"])
        params = {"rope_theta": hf["rope_theta"], **params}
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            hf.refuse("rope_parameters", "zoo rotates the whole head (partial_rotary_factor=1)")
        try:
            rope = Rope.from_hf(params)
        except ValueError as error:
            hf.refuse("rope_scaling", str(error))
        return {"attention.rope": rope}

    def _window(self, hf: HFConfig, num_layers: int) -> int | None:
        if self.window_option == "mistral":
            return hf["sliding_window"]
        if self.window_option != "qwen" or not hf["use_sliding_window"]:
            return None
        layer_types = hf["layer_types"] or [
            "sliding_attention" if i >= hf["max_window_layers"] else "full_attention"
            for i in range(num_layers)
        ]
        if all(t == "full_attention" for t in layer_types):
            return None
        if all(t == "sliding_attention" for t in layer_types):
            return hf["sliding_window"]
        hf.refuse(
            "use_sliding_window",
            f"a sliding window on some layers only (max_window_layers={hf['max_window_layers']}) "
            "is not implemented; zoo applies one window to every layer",
        )
        return None

    def _windows(self, hf: HFConfig, num_layers: int) -> ConfigFields:
        """The attention pattern's settings (one window on every layer, or none)."""
        return {"attention.window": self._window(hf, num_layers)}

    def _qk_norm(self, eps: float) -> QKNorm | None:
        """The family's QK-norm (an RMSNorm of the model's epsilon), or None."""
        return QKNorm(scope=self.qk_norm_scope, eps=eps) if self.has_qk_norm else None

    def _token_ids(self, hf: HFConfig, vocab: int) -> ConfigFields:
        eos = hf["eos_token_id"]
        eos_list = [i for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
        inside = [i for i in eos_list if 0 <= i < vocab]
        if len(inside) != len(eos_list):
            logger.warning("%s: eos ids %s outside the vocabulary are dropped", self.name, eos_list)
        pad = hf["pad_token_id"]
        return dict(
            bos_id=hf.token_id("bos_token_id", vocab),
            eos_id=inside[0] if inside else None,
            stop_ids=tuple(inside[1:]),
            # The checkpoint's padding is positional (attention_mask), never by id; zoo keeps the
            # pad id only for batching, as an id that is not also the end of a document.
            pad_id=pad if isinstance(pad, int) and 0 <= pad < vocab and pad not in inside else None,
        )

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        heads = hf["num_attention_heads"]
        d_model = hf["hidden_size"]
        num_layers = hf["num_hidden_layers"]
        attention_bias = bool(hf["attention_bias"]) if self.has_attention_bias_option else False
        if hf["attention_dropout"]:
            logger.info("%s: attention dropout %s kept", self.name, hf["attention_dropout"])
        vocab = hf["vocab_size"]
        eps = hf["rms_norm_eps"]
        return {
            "vocab_size": vocab,
            "d_model": d_model,
            "num_layers": num_layers,
            "max_positions": hf["max_position_embeddings"],
            "init_std": hf["initializer_range"],
            "num_heads": heads,
            "attention.num_kv_heads": hf["num_key_value_heads"] or heads,
            "attention.head_dim": hf["head_dim"] or d_model // heads,
            "attention.qkv_bias": True if self.qkv_bias_always else attention_bias,
            "attention.output_bias": attention_bias,
            "attention.qk_norm": self._qk_norm(eps),
            "attention.dropout": float(hf["attention_dropout"] or 0.0),
            "d_ff": hf["intermediate_size"],
            "feed_forward.activation": hf.activation(self.activation_option),
            "feed_forward.bias": bool(hf["mlp_bias"]),
            "norm.eps": eps,
            "dropout": 0.0,
            "head": self._head(hf, shapes),
            **self._windows(hf, num_layers),
            **self._rope(hf),
            **self._token_ids(hf, vocab),
        }

    def _head(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> LMHead:
        """The head of a causal checkpoint, or the score head of a `*ForSequenceClassification`
        one (which holds no vocabulary head: the token table stands in for it)."""
        score = shapes.get("score.weight")
        if score is not None:
            return LMHead(tie=True, scores=int(score[0]))
        return LMHead(tie=bool(hf["tie_word_embeddings"]))

    @property
    def score_class(self) -> str:
        """The transformers class of a model with a score head (`LMHead.scores`)."""
        return self.export_class.replace("ForCausalLM", "ForSequenceClassification")

    # -- writing config.json -------------------------------------------------------------------

    def export_parts(self, config: GPTConfig) -> ConfigFields:
        """The settings the family's config.json cannot change: what `hf_config` requires."""
        block = config.layers.block
        parts: ConfigFields = {
            "embedder.positions": "none",
            "embedder.norm": None,
            "embedder.scale": False,
            "norm.kind": "rmsnorm",
            "norm.weight_offset": 0.0,
            "norm_first": True,
            "output_norm": False,
            "attention_norm": True,
            "attention.qk_norm": self._qk_norm(block.norm.eps),
            "attention.scale_dim": None,
            "attention.softcap": None,
            "head.softcap": None,
        }
        if isinstance(block.feed_forward, FeedForwardSettings):
            parts["feed_forward.kind"] = "gated"
        return parts

    def check_layers(self, config: GPTConfig) -> None:
        """Refuse layers that differ: the family's config has one setting for every layer."""
        refuse_layer_overrides(config, self.export_class)

    def hf_config(self, config: GPTConfig) -> HFDict:
        require_fields(config, self.export_class, self.export_parts(config))
        self.check_layers(config)
        block = config.layers.block
        attention = block.attention
        rope = attention.rope
        if rope is None:
            raise UnsupportedExport(
                f"{self.export_class} rotates queries and keys: attention.rope=None (set a Rope)"
            )
        if rope.partial_rotary_factor != 1.0:
            raise UnsupportedExport(
                f"{self.export_class} rotates whole heads: attention.rope.partial_rotary_factor="
                f"{rope.partial_rotary_factor} (Phi3ForCausalLM rotates part of each head)"
            )
        qkv_bias, out_bias, mlp_bias = biases(config)
        if self.qkv_bias_always:
            if not qkv_bias or out_bias:
                raise UnsupportedExport(
                    f"{self.export_class} has biases on q/k/v and none on o, but this model has "
                    f"attention.qkv_bias={qkv_bias} and attention.output_bias={out_bias}"
                )
        elif qkv_bias != out_bias:
            raise UnsupportedExport(
                f"{self.export_class} has one attention_bias for q/k/v and o, but this model has "
                f"attention.qkv_bias={qkv_bias} and attention.output_bias={out_bias}"
            )
        for path, rate in residual_dropouts(config).items():
            logger.warning(
                "%s has no dropout there: %s=%s is not exported (inference is unaffected)",
                self.export_class,
                path,
                rate,
            )
        theta, scaling = rope.to_hf()
        out: HFDict = dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=block.feed_forward.d_ff,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.head_dim,
            hidden_act=export_activation(config),
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            rms_norm_eps=block.norm.eps,
            tie_word_embeddings=config.head.tie,
            attention_dropout=attention.dropout,
            bos_token_id=config.bos_id,
            eos_token_id=list(config.end_ids) if config.stop_ids else config.eos_id,
            pad_token_id=config.pad_id,
            rope_theta=theta,
            rope_scaling=scaling,
        )
        if self.has_attention_bias_option:
            out["attention_bias"] = bool(qkv_bias)
        if self.has_mlp_bias_option:
            out["mlp_bias"] = bool(mlp_bias)
        elif mlp_bias:
            raise UnsupportedExport(
                f"{self.export_class} has no feed-forward biases: feed_forward.bias=True"
            )
        out.update(self._export_window(config))
        if config.head.scores:  # a reward model or sequence classifier: no vocabulary head
            out.update(architectures=[self.score_class], num_labels=config.head.scores)
            if not config.head.tie:
                logger.warning("%s has no vocabulary head: head.weight is not exported",
                               self.score_class)  # fmt: skip
        return out

    def _export_window(self, config: GPTConfig) -> HFDict:
        window = config.layers.block.attention.window
        if self.window_option == "mistral":
            return dict(sliding_window=window)
        if self.window_option == "qwen":
            return dict(
                use_sliding_window=window is not None,
                sliding_window=window,
                max_window_layers=0 if window is not None else config.num_layers,
            )
        if window is not None:
            raise UnsupportedExport(
                f"{self.export_class} has no sliding window: attention.window={window}"
            )
        return {}

    # -- weights -------------------------------------------------------------------------------

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        scores = config.head.scores > 0  # *ForSequenceClassification: a score, no lm_head
        tie = config.head.tie or scores
        tied = ("lm_head.weight",) if tie and not scores else ()
        rules = [rule("model.embed_tokens.weight", "embedder.token_weight", aliases=tied)]
        qkv_bias, out_bias, mlp_bias = biases(config)
        qk_norm = config.layers.block.attention.qk_norm is not None
        projections = [
            ("self_attn.q_proj", "self_attention.query_proj", qkv_bias),
            ("self_attn.k_proj", "self_attention.key_proj", qkv_bias),
            ("self_attn.v_proj", "self_attention.value_proj", qkv_bias),
            ("self_attn.o_proj", "self_attention.output_proj", out_bias),
            ("mlp.gate_proj", "feed_forward.gate", mlp_bias),
            ("mlp.up_proj", "feed_forward.hidden", mlp_bias),
            ("mlp.down_proj", "feed_forward.output", mlp_bias),
        ]
        for i in range(config.num_layers):
            hf, zoo = f"model.layers.{i}.", f"layers.{i}."
            rules += [
                rule(f"{hf}input_layernorm.weight", f"{zoo}self_attention_norm.weight"),
                rule(f"{hf}post_attention_layernorm.weight", f"{zoo}feed_forward_norm.weight"),
            ]
            for hf_name, zoo_name, bias in projections:
                rules.append(rule(f"{hf}{hf_name}.weight", f"{zoo}{zoo_name}.weight"))
                if bias:
                    rules.append(rule(f"{hf}{hf_name}.bias", f"{zoo}{zoo_name}.bias"))
            if qk_norm:
                rules += [
                    rule(f"{hf}self_attn.q_norm.weight", f"{zoo}self_attention.query_norm.weight"),
                    rule(f"{hf}self_attn.k_norm.weight", f"{zoo}self_attention.key_norm.weight"),
                ]
        rules.append(rule("model.norm.weight", "final_norm.weight"))
        if not tie:
            rules.append(rule("lm_head.weight", "head.weight"))
        if scores:
            rules.append(rule("score.weight", "score.weight"))
        # rotary frequencies that older checkpoints saved as buffers: zoo computes them
        ignore = (r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq",)
        return KeyMap(rules, ignore=ignore)


class Llama(LlamaFamily):
    name = "llama"
    model_type = "llama"
    exports_scores = True
    loads: tuple[str, ...] = ("LlamaForCausalLM", "LlamaModel", "LlamaForSequenceClassification")
    export_class = "LlamaForCausalLM"
    config_class = "LlamaConfig"
    has_mlp_bias_option = True


class Mistral(LlamaFamily):
    name = "mistral"
    model_type = "mistral"
    exports_scores = True
    loads: tuple[str, ...] = (
        "MistralForCausalLM",
        "MistralModel",
        "MistralForSequenceClassification",
    )
    export_class = "MistralForCausalLM"
    config_class = "MistralConfig"
    has_attention_bias_option = False
    window_option = "mistral"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        intermediate_size=14336,
        num_key_value_heads=8,
        max_position_embeddings=4096 * 32,
        sliding_window=4096,
    )


class Qwen2(LlamaFamily):
    name = "qwen2"
    model_type = "qwen2"
    exports_scores = True
    loads: tuple[str, ...] = ("Qwen2ForCausalLM", "Qwen2Model", "Qwen2ForSequenceClassification")
    export_class = "Qwen2ForCausalLM"
    config_class = "Qwen2Config"
    zoo_base = with_parts(LLAMA, QWEN2)
    qkv_bias_always = True
    has_attention_bias_option = False
    window_option = "qwen"
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=151936,
        intermediate_size=22016,
        num_key_value_heads=32,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=None,
        use_sliding_window=False,
        sliding_window=4096,
        max_window_layers=28,
        layer_types=None,
    )


class Qwen3(Qwen2):
    name = "qwen3"
    model_type = "qwen3"
    loads: tuple[str, ...] = ("Qwen3ForCausalLM", "Qwen3Model", "Qwen3ForSequenceClassification")
    export_class = "Qwen3ForCausalLM"
    config_class = "Qwen3Config"
    zoo_base = with_parts(LLAMA, QWEN3)
    qkv_bias_always = False
    has_attention_bias_option = True
    has_qk_norm = True
    extra_defaults: ClassVar[dict[str, Any]] = dict(Qwen2.extra_defaults, head_dim=128)


DECODER_FAMILIES = (Llama(), Mistral(), Qwen2(), Qwen3())


def decoder_family_for(config: GPTConfig) -> LlamaFamily:
    """The HuggingFace family a rotary zoo GPT exports to: the simplest that expresses it."""
    attention = config.layers.block.attention
    qkv_bias, out_bias, _ = biases(config)
    llama, mistral, qwen2, qwen3 = DECODER_FAMILIES
    if attention.qk_norm is not None:
        return qwen3
    if qkv_bias and not out_bias:
        return qwen2
    if attention.window is not None:
        return mistral
    return llama


__all__ = [
    "DECODER_FAMILIES",
    "Llama",
    "LlamaFamily",
    "Mistral",
    "Qwen2",
    "Qwen3",
    "biases",
    "decoder_family_for",
]
