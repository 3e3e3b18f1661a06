"""ModernBERT (`ModernBertForSequenceClassification`, `ModernBertModel`,
`ModernBertForMaskedLM`'s encoder) <-> `zoo.Classifier`.

ModernBERT is a pre-norm encoder made of parts zoo already has, each a config field:

| ModernBERT part                                      | zoo field                                 |
| ---------------------------------------------------- | ----------------------------------------- |
| rotary positions, a base per layer kind              | `positions="rotary"`, `local_rope_theta`  |
| local layers see `local_attention // 2` either side  | `sliding_window = local_attention//2 + 1` |
| a global layer every `global_attn_every_n_layers`    | `global_layers`                           |
| GeGLU (`mlp.Wi` fused: activated half, then gate)    | `feed_forward="gated"`                    |
| LayerNorms without bias (`norm_bias=False`)          | `norm_bias=False`                         |
| no norm before layer 0's attention                   | `first_attention_norm=False`              |
| `head`: dense -> activation -> norm on the pooled    | `pooler`, `pooler_activation`, `pooler_norm` |
| `classifier_pooling` cls / mean                      | `pooling` first / mean                    |

The fused `attn.Wqkv` and `mlp.Wi` split into zoo's projections on load and fuse again on
export. Layer 0 has no `attn_norm`, and neither has zoo's: it is a group of its own in the
layer stack (`zoo.nn.stack`), so the parameter counts are transformers'. A bare `ModernBertModel` (or a
masked-LM checkpoint without `head.*`) gets a fresh head. Configs in the hub's spelling
(`global_rope_theta`, `local_rope_theta`, `global_attn_every_n_layers`) and in transformers 5's
(`layer_types`, `rope_parameters` per layer kind) are both read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    require_fields,
)
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, Transform, rule
from zoo.models import ClassifierConfig
from zoo.nn.rotary import Rope

SLIDING, FULL = "sliding_attention", "full_attention"
POOLINGS = {"cls": "first", "mean": "mean"}

DEFAULTS: HFDict = dict(
    vocab_size=50368,
    hidden_size=768,
    intermediate_size=1152,
    num_hidden_layers=22,
    num_attention_heads=12,
    hidden_activation="gelu",
    max_position_embeddings=8192,
    initializer_range=0.02,
    norm_eps=1e-5,
    norm_bias=False,
    pad_token_id=50283,
    attention_bias=False,
    attention_dropout=0.0,
    layer_types=None,
    rope_parameters=None,
    rope_scaling=None,
    global_rope_theta=160_000.0,
    local_rope_theta=10_000.0,
    global_attn_every_n_layers=3,
    local_attention=128,
    embedding_dropout=0.0,
    mlp_bias=False,
    mlp_dropout=0.0,
    classifier_pooling="cls",
    classifier_dropout=0.0,
    classifier_bias=False,
    classifier_activation="gelu",
    tie_word_embeddings=True,
    problem_type=None,
)


def _fused(sizes: tuple[int, ...], what: str) -> Transform:
    """One HF weight (or bias) whose rows are several zoo arrays of `sizes` rows, in order."""
    cuts = np.cumsum(sizes)[:-1]
    return Transform(
        what,
        lambda arrays: list(np.split(arrays[0], cuts, axis=0)),
        lambda arrays: [np.concatenate(arrays, axis=0)],
        lambda shapes: [(sum(shape[0] for shape in shapes), *shapes[0][1:])],
    )


class ModernBert(Architecture[ClassifierConfig]):
    name = "modernbert"
    model_type = "modernbert"
    loads = ("ModernBertForSequenceClassification", "ModernBertModel", "ModernBertForMaskedLM")
    export_class = "ModernBertForSequenceClassification"
    prefix = "model."
    config_class = "ModernBertConfig"
    zoo_config_class = ClassifierConfig

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def task_weights(self, hf_class: str) -> tuple[str, ...]:
        if hf_class.endswith("ForSequenceClassification"):
            return ("head.dense.weight", "classifier.weight", "classifier.bias")
        return ()

    # -- reading config.json ------------------------------------------------------------------

    def _layer_types(self, hf: HFConfig, num_layers: int) -> list[str]:
        types = hf["layer_types"]
        if types is None:
            every = hf["global_attn_every_n_layers"] or 1
            types = [SLIDING if i % every else FULL for i in range(num_layers)]
        if len(types) != num_layers or set(types) - {SLIDING, FULL}:
            hf.refuse("layer_types", f"needs {num_layers} of {SLIDING!r} and {FULL!r}")
        return list(types)

    def _thetas(self, hf: HFConfig) -> tuple[float, float]:
        """(global, local) rotary bases, from `rope_parameters` or the hub's two fields."""
        if hf["rope_scaling"]:
            hf.refuse("rope_scaling", "zoo rotates ModernBERT with plain RoPE")
        params = hf["rope_parameters"] or {}
        full, sliding = params.get(FULL) or {}, params.get(SLIDING) or {}
        for kind in (full, sliding):
            if kind.get("rope_type", "default") != "default":
                hf.refuse("rope_parameters", "zoo rotates ModernBERT with plain RoPE")
        global_theta = full.get("rope_theta", hf["global_rope_theta"])
        local_theta = sliding.get("rope_theta", hf["local_rope_theta"])
        return float(global_theta), float(local_theta)

    def _layers(self, hf: HFConfig, num_layers: int) -> dict[str, Any]:
        types = self._layer_types(hf, num_layers)
        global_theta, local_theta = self._thetas(hf)
        full = tuple(i for i, kind in enumerate(types) if kind == FULL)
        if SLIDING not in types:
            return dict(sliding_window=None, global_layers=None, rope=Rope(theta=global_theta))
        window = int(hf["local_attention"]) // 2 + 1  # |i - j| <= local_attention // 2
        if not full:
            return dict(sliding_window=window, global_layers=None, rope=Rope(theta=local_theta))
        return dict(
            sliding_window=window,
            global_layers=full,
            rope=Rope(theta=global_theta),
            local_rope_theta=local_theta,
        )

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        if hf["classifier_pooling"] not in POOLINGS:
            hf.refuse("classifier_pooling", f"zoo pools by {sorted(POOLINGS)}")
        vocab, num_layers = hf["vocab_size"], hf["num_hidden_layers"]
        head = shapes.get("classifier.weight")
        labels = hf["id2label"]
        attention_bias = bool(hf["attention_bias"])
        return dict(
            vocab_size=vocab,
            d_model=hf["hidden_size"],
            num_heads=hf["num_attention_heads"],
            num_layers=num_layers,
            d_ff=hf["intermediate_size"],
            feed_forward="gated",
            activation=hf.activation("hidden_activation"),
            max_positions=hf["max_position_embeddings"],
            norm="layernorm",
            norm_first=True,
            norm_bias=bool(hf["norm_bias"]),
            first_attention_norm=False,
            layer_norm_eps=hf["norm_eps"],
            use_bias=attention_bias,
            qkv_bias=attention_bias,
            attention_output_bias=attention_bias,
            feed_forward_bias=bool(hf["mlp_bias"]),
            positions="rotary",
            embedding_norm=True,
            scale_embeddings=False,
            type_vocab_size=0,
            dropout=float(hf["embedding_dropout"] or 0.0),
            attention_dropout=float(hf["attention_dropout"] or 0.0),
            activation_dropout=float(hf["mlp_dropout"] or 0.0),
            classifier_dropout=float(hf["classifier_dropout"] or 0.0),
            init_std=hf["initializer_range"],
            pad_id=hf.token_id("pad_token_id", vocab),
            num_classes=head[0] if head is not None else (len(labels) if labels else 2),
            pooling=POOLINGS[hf["classifier_pooling"]],
            pooler=True,
            pooler_activation=hf.activation("classifier_activation"),
            pooler_bias=bool(hf["classifier_bias"]),
            pooler_norm=True,
            **self._layers(hf, num_layers),
        )

    # -- writing config.json -------------------------------------------------------------------

    def hf_config(self, config: ClassifierConfig) -> HFDict:
        require_fields(
            config,
            self.export_class,
            norm="layernorm",
            norm_first=True,
            first_attention_norm=False,
            positions="rotary",
            feed_forward="gated",
            embedding_norm=True,
            scale_embeddings=False,
            type_vocab_size=0,
            position_offset=0,
            pooler=True,
            pooler_norm=True,
            qk_norm=False,
            output_norm=False,
        )
        bias = config.use_bias if config.qkv_bias is None else config.qkv_bias
        out_bias = config.use_bias if config.attention_output_bias is None else bias
        if config.kv_heads != config.num_heads or bias != out_bias:
            raise UnsupportedExport(
                f"{self.export_class} has one head count and one attention_bias for Wqkv and Wo"
            )
        if config.rope.scaling is not None or config.rope.partial_rotary_factor != 1.0:
            raise UnsupportedExport(f"{self.export_class} rotates with plain RoPE")
        mlp_bias = config.use_bias if config.feed_forward_bias is None else config.feed_forward_bias
        window, full = config.sliding_window, config.global_layers
        local_theta = config.local_rope_theta
        if window is None:
            types = [FULL] * config.num_layers
            window = 65  # unused: no layer is local
        else:
            types = [FULL if full and i in full else SLIDING for i in range(config.num_layers)]
        if full is None and config.sliding_window is not None:
            local_theta = config.rope.theta  # every layer local: they rotate by the one base
        return dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=config.d_ff,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            hidden_activation=export_activation(config),
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            norm_eps=config.layer_norm_eps,
            norm_bias=config.norm_bias,
            pad_token_id=config.pad_id,
            attention_bias=bool(bias),
            attention_dropout=config.attention_dropout,
            embedding_dropout=config.dropout,
            mlp_bias=bool(mlp_bias),
            mlp_dropout=config.dropout
            if config.activation_dropout is None
            else config.activation_dropout,
            layer_types=types,
            local_attention=(window - 1) * 2,
            global_rope_theta=config.rope.theta,
            local_rope_theta=config.rope.theta if local_theta is None else local_theta,
            classifier_pooling="cls" if config.pooling == "first" else "mean",
            classifier_dropout=config.dropout
            if config.classifier_dropout is None
            else config.classifier_dropout,
            classifier_bias=config.pooler_bias,
            classifier_activation=config.pooler_activation,
            **_special_ids(config.vocab_size),
            id2label={str(i): f"LABEL_{i}" for i in range(config.num_classes)},
            label2id={f"LABEL_{i}": i for i in range(config.num_classes)},
        )

    # -- weights -------------------------------------------------------------------------------

    def key_map(
        self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        d, norm_bias = config.d_model, config.norm_bias
        attention_bias = config.use_bias if config.qkv_bias is None else config.qkv_bias
        mlp_bias = config.use_bias if config.feed_forward_bias is None else config.feed_forward_bias
        qkv = _fused((d, d, d), "fused query/key/value rows (Wqkv)")
        gate_up = _fused((config.d_ff, config.d_ff), "fused activated/gate rows (Wi)")

        def linear(hf: str, zoo: str, bias: bool, optional: bool = False) -> list[Rule]:
            rules = [rule(f"{hf}.weight", f"{zoo}.weight", optional=optional)]
            return rules + ([rule(f"{hf}.bias", f"{zoo}.bias", optional=optional)] if bias else [])

        def fused(hf: str, zoo: tuple[str, ...], transform: Transform, bias: bool) -> list[Rule]:
            parts = [Rule((f"{hf}.weight",), tuple(f"{z}.weight" for z in zoo), transform)]
            if bias:
                parts.append(Rule((f"{hf}.bias",), tuple(f"{z}.bias" for z in zoo), transform))
            return parts

        rules = [
            rule("model.embeddings.tok_embeddings.weight", "embedder.token_weight"),
            *linear("model.embeddings.norm", "embedder.norm", norm_bias),
        ]
        for i in range(config.num_layers):
            hf, zoo = f"model.layers.{i}.", f"encoder.{i}."
            attention = f"{zoo}self_attention."
            if i > 0:  # layer 0 has no attention norm
                rules += linear(f"{hf}attn_norm", f"{zoo}self_attention_norm", norm_bias)
            projections = tuple(f"{attention}{name}_proj" for name in ("query", "key", "value"))
            rules += [
                *fused(f"{hf}attn.Wqkv", projections, qkv, attention_bias),
                *linear(f"{hf}attn.Wo", f"{attention}output_proj", attention_bias),
                *linear(f"{hf}mlp_norm", f"{zoo}feed_forward_norm", norm_bias),
                *fused(
                    f"{hf}mlp.Wi",
                    (f"{zoo}feed_forward.gate", f"{zoo}feed_forward.hidden"),
                    gate_up,
                    mlp_bias,
                ),
                *linear(f"{hf}mlp.Wo", f"{zoo}feed_forward.output", mlp_bias),
            ]
        rules += linear("model.final_norm", "final_norm", norm_bias)
        rules += linear("head.dense", "pooler", config.pooler_bias, optional=True)
        rules += linear("head.norm", "pooler_norm", norm_bias, optional=True)
        ignore = [r"model\.rotary_emb\..*", r"decoder\..*"]  # the masked-LM decoder
        if self._load_head(config, shapes):  # optional: a bare encoder gets a fresh head
            rules += linear("classifier", "head", True, optional=True)
        else:
            ignore.append(r"classifier\..*")
        return KeyMap(rules, ignore=tuple(ignore))

    @staticmethod
    def _load_head(config: ClassifierConfig, shapes: Mapping[str, Shape] | None) -> bool:
        """False where the checkpoint's class head has another number of classes."""
        if shapes is None or "classifier.weight" not in shapes:
            return True
        return shapes["classifier.weight"][0] == config.num_classes


def _special_ids(vocab_size: int) -> HFDict:
    """ModernBERT's [CLS]/[SEP] ids (zoo's config does not carry them): the released
    tokenizer's where the vocabulary holds them, else none."""
    ids = dict(bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)
    return {name: (value if value < vocab_size else None) for name, value in ids.items()}


MODERNBERT = ModernBert()

__all__ = ["MODERNBERT", "ModernBert"]
