"""BERT (`BertModel`, `BertForSequenceClassification`, pretraining checkpoints) <-> `zoo.Classifier`.

BERT is post-LN with learned positions, token types, a LayerNorm on the embeddings, exact GELU,
LayerNorm epsilon 1e-12 and a pooler (dense + tanh on [CLS]) before the class head. A checkpoint
without a sequence-classification head (a bare `BertModel`, `bert-base-uncased`'s pretraining
heads) gets a freshly initialised head with `num_classes` outputs; so does one whose head has a
different number of classes than asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.interop.architecture import (
    Architecture,
    HFConfig,
    UnsupportedExport,
    export_activation,
    logger,
    require_fields,
    warn_activation_dropout,
)
from zoo.interop.rules import KeyMap, Shape, rule, weight_and_bias
from zoo.models import ClassifierConfig

DEFAULTS: dict[str, Any] = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    pad_token_id=0,
    classifier_dropout=None,
    position_embedding_type="absolute",
    is_decoder=False,
    add_cross_attention=False,
    problem_type=None,
)
HEAD = "classifier"


class Bert(Architecture[ClassifierConfig]):
    name = "bert"
    model_type = "bert"
    loads = ("BertForSequenceClassification", "BertModel", "BertForPreTraining", "BertForMaskedLM")
    export_class = "BertForSequenceClassification"
    prefix = "bert."
    config_class = "BertConfig"
    zoo_config_class = ClassifierConfig

    def hf_defaults(self) -> dict[str, Any]:
        return dict(DEFAULTS)

    def task_weights(self, hf_class: str) -> tuple[str, ...]:
        if hf_class.endswith("ForSequenceClassification"):
            return (f"{HEAD}.weight", f"{HEAD}.bias")
        return ()

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        hf.require(
            "position_embedding_type",
            ("absolute",),
            "zoo implements absolute (learned) positions only",
        )
        hf.require("is_decoder", (False,), "zoo.Classifier is a bidirectional encoder")
        hf.require("add_cross_attention", (False,), "zoo.Classifier has no cross-attention")
        if hf["problem_type"] == "multi_label_classification":
            logger.warning(
                "bert: problem_type='multi_label_classification': the logits are the same, but "
                "train them with a sigmoid (binary cross-entropy) loss, not softmax"
            )
        head = shapes.get(f"{HEAD}.weight")
        labels = hf["id2label"]
        num_classes = head[0] if head is not None else (len(labels) if labels else 2)
        return dict(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            num_heads=hf["num_attention_heads"],
            num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            max_positions=hf["max_position_embeddings"],
            activation=hf.activation("hidden_act"),
            dropout=hf["hidden_dropout_prob"],
            attention_dropout=hf["attention_probs_dropout_prob"],
            activation_dropout=0.0,  # BERT's intermediate layer has no dropout
            classifier_dropout=hf["classifier_dropout"],
            layer_norm_eps=hf["layer_norm_eps"],
            init_std=hf["initializer_range"],
            type_vocab_size=hf["type_vocab_size"],
            pad_id=hf.token_id("pad_token_id", hf["vocab_size"]),
            num_classes=num_classes,
            pooler=f"{self.prefix}pooler.dense.weight" in shapes,
            pooling="first",
            norm_first=False,
            embedding_norm=True,
            positions="learned",
            use_bias=True,
            scale_embeddings=False,
        )

    def hf_config(self, config: ClassifierConfig) -> dict[str, Any]:
        require_fields(
            config,
            self.export_class,
            norm_first=False,
            embedding_norm=True,
            positions="learned",
            use_bias=True,
            scale_embeddings=False,
            pooling="first",
            pooler=True,
        )
        if config.type_vocab_size < 1:
            raise UnsupportedExport(
                f"{self.export_class} always has token-type embeddings: type_vocab_size=0 "
                "cannot be exported"
            )
        warn_activation_dropout(config, self.export_class)
        return dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=config.d_ff,
            hidden_act=export_activation(config),
            hidden_dropout_prob=config.dropout,
            attention_probs_dropout_prob=config.attention_dropout,
            classifier_dropout=config.classifier_dropout,
            max_position_embeddings=config.max_positions,
            type_vocab_size=config.type_vocab_size,
            layer_norm_eps=config.layer_norm_eps,
            initializer_range=config.init_std,
            pad_token_id=config.pad_id,
            id2label={str(i): f"LABEL_{i}" for i in range(config.num_classes)},
            label2id={f"LABEL_{i}": i for i in range(config.num_classes)},
        )

    def key_map(
        self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        p = self.prefix
        rules = [
            rule(f"{p}embeddings.word_embeddings.weight", "embedder.token_weight"),
            rule(f"{p}embeddings.position_embeddings.weight", "embedder.position_weight"),
            *weight_and_bias(f"{p}embeddings.LayerNorm", "embedder.norm"),
        ]
        if config.type_vocab_size > 0:
            rules.append(
                rule(f"{p}embeddings.token_type_embeddings.weight", "embedder.token_type_weight")
            )
        for i in range(config.num_layers):
            hf, zoo = f"{p}encoder.layer.{i}.", f"encoder.{i}."
            rules += [
                *weight_and_bias(f"{hf}attention.self.query", f"{zoo}self_attention.query_proj"),
                *weight_and_bias(f"{hf}attention.self.key", f"{zoo}self_attention.key_proj"),
                *weight_and_bias(f"{hf}attention.self.value", f"{zoo}self_attention.value_proj"),
                *weight_and_bias(f"{hf}attention.output.dense", f"{zoo}self_attention.output_proj"),
                *weight_and_bias(f"{hf}attention.output.LayerNorm", f"{zoo}self_attention_norm"),
                *weight_and_bias(f"{hf}intermediate.dense", f"{zoo}feed_forward.hidden"),
                *weight_and_bias(f"{hf}output.dense", f"{zoo}feed_forward.output"),
                *weight_and_bias(f"{hf}output.LayerNorm", f"{zoo}feed_forward_norm"),
            ]
        if config.pooler:
            rules += weight_and_bias(f"{p}pooler.dense", "pooler")
        # pretraining heads (masked LM, next sentence) and old position-id buffers
        ignore = [r"cls\..*", rf"{p}embeddings\.position_ids"]
        pretraining = sorted(
            {".".join(k.split(".")[:2]) for k in shapes or () if k.startswith("cls.")}
        )
        if pretraining:
            logger.warning(
                "bert: the checkpoint's pretraining heads (%s) are not part of zoo.Classifier "
                "and are left out",
                ", ".join(pretraining),
            )
        if self._load_head(config, shapes):
            rules += weight_and_bias(HEAD, "head", optional=True)
        else:
            ignore.append(rf"{HEAD}\..*")
        return KeyMap(rules, ignore=tuple(ignore))

    def _load_head(self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None) -> bool:
        if shapes is None or f"{HEAD}.weight" not in shapes:
            return True  # exporting, or no head to load: the optional rule leaves it fresh
        rows = shapes[f"{HEAD}.weight"][0]
        if rows == config.num_classes:
            return True
        logger.warning(
            "bert: the checkpoint's classification head has %d classes but num_classes=%d: "
            "the head is initialised afresh (train it before use)",
            rows,
            config.num_classes,
        )
        return False
