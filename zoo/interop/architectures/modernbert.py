"""ModernBERT (`ModernBertForSequenceClassification`, `ModernBertModel`,
`ModernBertForMaskedLM`'s encoder) <-> `zoo.Classifier`.

ModernBERT is a pre-norm encoder made of parts zoo already has (`zoo.presets.parts.MODERNBERT`,
this family's `zoo_base`), each a path in the config tree:

| ModernBERT part                                     | zoo config                                  |
| --------------------------------------------------- | ------------------------------------------- |
| rotary positions, a base per layer kind             | `attention.rope` (the local layers' base)   |
| local layers see `local_attention // 2` either side | `attention.window = local_attention//2 + 1` |
| a global layer every `global_attn_every_n_layers`   | a `LayerOverride`: no window, its own base  |
| GeGLU (`mlp.Wi` fused: activated half, then gate)   | `feed_forward.kind="gated"`                 |
| LayerNorms without bias (`norm_bias=False`)         | `norm.bias`, `embedder.norm.bias`           |
| no norm before layer 0's attention                  | a `LayerOverride`: `attention_norm=False`   |
| `head`: dense -> activation -> norm on the pooled   | `head.pooler` (`Pooler(norm=True)`)         |
| `classifier_pooling` cls / mean                     | `head.pooling` first / mean                 |

Export reads each layer's settings (`config.layers.layers()`) back into `layer_types` and the
two bases, and refuses layers that differ in anything else.

The fused `attn.Wqkv` and `mlp.Wi` split into zoo's projections on load and fuse again on
export. Layer 0 has no `attn_norm`, and neither has zoo's: it is a group of its own in the
layer stack (`zoo.nn.stack`), so the parameter counts are transformers'. A bare
`ModernBertModel` (or a masked-LM checkpoint without `head.*`) gets a fresh head. Configs in the
hub's spelling (`global_rope_theta`, `local_rope_theta`, `global_attn_every_n_layers`) and in
transformers 5's (`layer_types`, `rope_parameters` per layer kind) are both read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    require_fields,
)
from zoo.interop.architectures.bert import check_encoder_parts, dense_feed_forward
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, Transform, rule
from zoo.models import ClassifierConfig
from zoo.models.classifier import POOLER_ACTIVATIONS, ClassifierHead, Pooler
from zoo.nn.block import BlockSettings
from zoo.nn.norm import NormSettings
from zoo.nn.plan import LayerOverride, weights_of
from zoo.nn.rotary import Rope
from zoo.presets import parts

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
    zoo_base = parts.with_parts(parts.BERT, parts.MODERNBERT)

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

    def _layers(self, hf: HFConfig, num_layers: int) -> ConfigFields:
        """The local layers' window and base (the base block's), and the global layers as an
        override: no window, the global base (every n-th layer, as the hub's config says, or
        the layers `layer_types` names)."""
        types = self._layer_types(hf, num_layers)
        global_theta, local_theta = self._thetas(hf)
        full = tuple(i for i, kind in enumerate(types) if kind == FULL)
        # layer 0's attention reads the normed embeddings directly
        overrides = [LayerOverride(changes={"attention_norm": False}, layers=(0,))]
        if SLIDING not in types:
            fields: ConfigFields = {
                "attention.window": None,
                "attention.rope": Rope(theta=global_theta),
            }
            return {**fields, "layers.overrides": tuple(overrides)}
        window = int(hf["local_attention"]) // 2 + 1  # |i - j| <= local_attention // 2
        if full:
            changes = {"attention.window": None, "attention.rope": Rope(theta=global_theta)}
            every = hf["global_attn_every_n_layers"]
            if every and full == tuple(range(0, num_layers, every)):
                overrides.insert(0, LayerOverride(changes=changes, step=every))
            else:
                overrides.insert(0, LayerOverride(changes=changes, layers=full))
        return {
            "attention.window": window,
            "attention.rope": Rope(theta=local_theta),
            "layers.overrides": tuple(overrides),
        }

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        if hf["classifier_pooling"] not in POOLINGS:
            hf.refuse("classifier_pooling", f"zoo pools by {sorted(POOLINGS)}")
        vocab, num_layers = hf["vocab_size"], hf["num_hidden_layers"]
        head = shapes.get("classifier.weight")
        labels = hf["id2label"]
        attention_bias = bool(hf["attention_bias"])
        norm = NormSettings(eps=hf["norm_eps"], bias=bool(hf["norm_bias"]))
        dropout = float(hf["embedding_dropout"] or 0.0)
        pooler = Pooler(
            activation=self._pooler_activation(hf),
            bias=bool(hf["classifier_bias"]),
            norm=True,
        )
        return {
            "vocab_size": vocab,
            "d_model": hf["hidden_size"],
            "max_positions": hf["max_position_embeddings"],
            "init_std": hf["initializer_range"],
            "pad_id": hf.token_id("pad_token_id", vocab),
            "mask_id": None,  # config.json does not name it (the tokenizer does)
            "num_layers": num_layers,
            "attention.num_heads": hf["num_attention_heads"],
            "attention.qkv_bias": attention_bias,
            "attention.output_bias": attention_bias,
            "attention.dropout": float(hf["attention_dropout"] or 0.0),
            "feed_forward.d_ff": hf["intermediate_size"],
            "feed_forward.activation": hf.activation("hidden_activation"),
            "feed_forward.bias": bool(hf["mlp_bias"]),
            "feed_forward.dropout": float(hf["mlp_dropout"] or 0.0),
            "norm": norm,
            "layers.block.dropout": dropout,
            "embedder.norm": norm,
            "embedder.dropout": dropout,
            "head": ClassifierHead(
                num_classes=head[0] if head is not None else (len(labels) if labels else 2),
                pooling=POOLINGS[hf["classifier_pooling"]],
                pooler=pooler,
                dropout=float(hf["classifier_dropout"] or 0.0),
            ),
            **self._layers(hf, num_layers),
        }

    @staticmethod
    def _pooler_activation(hf: HFConfig) -> str:
        activation = hf.activation("classifier_activation")
        if activation not in POOLER_ACTIVATIONS:
            hf.refuse("classifier_activation", f"zoo's pooler takes {sorted(POOLER_ACTIVATIONS)}")
        return activation

    # -- writing config.json -------------------------------------------------------------------

    def _export_layers(self, config: ClassifierConfig) -> HFDict:
        """`layer_types`, `local_attention` and the two rotary bases of the plan's layers;
        refuses layers that differ otherwise, or a layer 0 with a norm before its attention."""
        target = self.export_class
        layers = config.layers.layers()
        if layers[0].attention_norm or not all(layer.attention_norm for layer in layers[1:]):
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: it has no norm before layer 0's "
                "attention and one before every other layer's (layers.overrides "
                "attention_norm=False on layer 0 only)"
            )
        base = _same_weights(layers[0])
        if any(_same_weights(layer) != base for layer in layers):
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: its layers differ in more than their "
                "window and rotary base (layers.overrides)"
            )
        types: list[str] = []
        windows: set[int] = set()
        ropes: dict[str, set[Rope]] = {FULL: set(), SLIDING: set()}
        for layer in layers:
            window, rope = layer.attention.window, layer.attention.rope
            if rope is None or rope.scaling is not None or rope.partial_rotary_factor != 1.0:
                raise UnsupportedExport(
                    f"{target} rotates with plain RoPE: attention.rope={rope!r} cannot be exported"
                )
            kind = FULL if window is None else SLIDING
            windows |= set() if window is None else {window}
            types.append(kind)
            ropes[kind].add(rope)
        if len(windows) > 1 or any(len(found) > 1 for found in ropes.values()):
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: its local layers share one window "
                "and each kind of layer one rotary base"
            )
        full_rope = next(iter(ropes[FULL] or ropes[SLIDING]))
        local_rope = next(iter(ropes[SLIDING] or ropes[FULL]))
        window = windows.pop() if windows else 65  # unused when no layer is local
        return dict(
            layer_types=types,
            local_attention=(window - 1) * 2,
            global_rope_theta=full_rope.theta,
            local_rope_theta=local_rope.theta,
        )

    def hf_config(self, config: ClassifierConfig) -> HFDict:
        target = self.export_class
        check_encoder_parts(config, target)
        block = config.layers.block
        norm = block.norm
        pooler = config.head.pooler
        require_fields(
            config,
            target,
            {
                "norm_first": True,
                "output_norm": False,
                "norm.kind": "layernorm",
                "norm.weight_offset": 0.0,
                "feed_forward.kind": "gated",
                "embedder.positions": "none",
                "embedder.scale": False,
                "embedder.norm": norm,  # the same norm_eps and norm_bias
                "embedder.type_vocab_size": 0,
                "embedder.position_offset": 0,
            },
        )
        if pooler is None or not pooler.norm:
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: its head is dense, activation, norm "
                f"(head.pooler=Pooler(norm=True)), got head.pooler={pooler!r}"
            )
        attention = block.attention
        if attention.qkv_bias != attention.output_bias:
            raise UnsupportedExport(
                f"{target} has one attention_bias for Wqkv and Wo: attention.qkv_bias="
                f"{attention.qkv_bias} and attention.output_bias={attention.output_bias} differ"
            )
        feed_forward = dense_feed_forward(config, target)
        return dict(
            model_type=self.model_type,
            architectures=[target],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=feed_forward.d_ff,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            hidden_activation=export_activation(config),
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            norm_eps=norm.eps,
            norm_bias=norm.bias,
            pad_token_id=config.pad_id,
            attention_bias=attention.qkv_bias,
            attention_dropout=attention.dropout,
            embedding_dropout=config.embedder.dropout,
            mlp_bias=feed_forward.bias,
            mlp_dropout=feed_forward.dropout,
            **self._export_layers(config),
            classifier_pooling="cls" if config.head.pooling == "first" else "mean",
            classifier_dropout=config.head.dropout,
            classifier_bias=pooler.bias,
            classifier_activation=pooler.activation,
            **_special_ids(config.vocab_size),
            id2label={str(i): f"LABEL_{i}" for i in range(config.num_classes)},
            label2id={f"LABEL_{i}": i for i in range(config.num_classes)},
        )

    # -- weights -------------------------------------------------------------------------------

    def key_map(
        self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        block = config.layers.block
        d, norm_bias = config.d_model, block.norm.bias
        attention_bias = block.attention.qkv_bias
        feed_forward = dense_feed_forward(config, self.export_class)
        mlp_bias, d_ff = feed_forward.bias, feed_forward.d_ff
        pooler_bias = config.head.pooler is not None and config.head.pooler.bias
        qkv = _fused((d, d, d), "fused query/key/value rows (Wqkv)")
        gate_up = _fused((d_ff, d_ff), "fused activated/gate rows (Wi)")

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
        for i, settings in enumerate(config.layers.layers()):
            hf, zoo = f"model.layers.{i}.", f"encoder.{i}."
            attention = f"{zoo}self_attention."
            if settings.attention_norm:  # layer 0 has none
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
        rules += linear("head.dense", "pooler", pooler_bias, optional=True)
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


def _same_weights(settings: BlockSettings) -> BlockSettings:
    """A layer's settings without what ModernBERT's layers may differ in: the window, the
    rotary base, and layer 0's missing attention norm."""
    return dataclasses.replace(weights_of(settings), attention_norm=True)


def _special_ids(vocab_size: int) -> HFDict:
    """ModernBERT's [CLS]/[SEP] ids (zoo's config does not carry them): the released
    tokenizer's where the vocabulary holds them, else none."""
    ids = dict(bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)
    return {name: (value if value < vocab_size else None) for name, value in ids.items()}


MODERNBERT = ModernBert()

__all__ = ["MODERNBERT", "ModernBert"]
