"""BERT (`BertModel`, `BertForSequenceClassification`, `BertForMaskedLM`) <-> `zoo.Classifier`.

BERT is post-LN with learned positions, token types, a LayerNorm on the embeddings, exact GELU,
LayerNorm epsilon 1e-12 and a pooler (dense + tanh on [CLS]) before the class head. A checkpoint
without a sequence-classification head (a bare `BertModel`, `bert-base-uncased`'s pretraining
heads) gets a freshly initialised head with `num_classes` outputs; so does one whose head has a
different number of classes than asked for. A checkpoint with a masked-LM head
(`cls.predictions.*`) loads it as the classifier's `mlm_head` (`masked_lm=True`, its decoder
tied to the token embeddings) and exports back to `BertForMaskedLM`.

The config is `zoo.presets.parts.BERT` (`zoo_base`) with the sizes, epsilons, dropouts and heads
of config.json; export refuses a config whose parts BERT's config cannot say (pre-norm, rotary
positions, a window, grouped-query heads, layers that differ, ...), naming their paths.

`Bert` is also the engine of its relatives (roberta.py, distilbert.py): they change the key
names, the head's keys, the base parts and the config fields, through the class attributes and
hooks below.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    logger,
    refuse_layer_overrides,
    require_fields,
    warn_activation_dropout,
)
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, rule, weight_and_bias
from zoo.models import ClassifierConfig
from zoo.models.classifier import Pooler
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.norm import NormSettings
from zoo.presets.parts import BERT

DEFAULTS: HFDict = dict(
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
    tie_word_embeddings=True,
)


def dense_feed_forward(config: ClassifierConfig, target: str) -> FeedForwardSettings:
    """The base block's feed-forward; `target` has no mixture of experts."""
    feed_forward = config.layers.block.feed_forward
    if not isinstance(feed_forward, FeedForwardSettings):
        raise UnsupportedExport(
            f"{target} cannot express this zoo model: layers.block.feed_forward is a "
            f"{type(feed_forward).__name__} (a mixture of experts), and {target} has one dense "
            "feed-forward per layer"
        )
    return feed_forward


def check_encoder_parts(config: ClassifierConfig, target: str) -> None:
    """Refuse what no encoder family's config says: a mixture of experts, grouped-query heads,
    a head width other than d_model / num_heads, another score scale, QK-norm, soft-capping."""
    dense_feed_forward(config, target)
    attention = config.layers.block.attention
    head_dim = config.head_dim
    wrong = []
    if attention.kv_heads != attention.num_heads:
        wrong.append(f"attention.num_kv_heads={attention.num_kv_heads} (needs num_heads)")
    if head_dim * attention.num_heads != config.d_model:
        wrong.append(f"attention.head_dim={attention.head_dim} (needs d_model // num_heads)")
    if attention.scale_dim not in (None, head_dim):
        wrong.append(f"attention.scale_dim={attention.scale_dim} (needs None: head_dim)")
    if wrong:
        raise UnsupportedExport(f"{target} cannot express this zoo model: {', '.join(wrong)}")
    require_fields(config, target, {"attention.qk_norm": None, "attention.softcap": None})


def warn_dropouts(config: ClassifierConfig, target: str) -> None:
    """The dropouts `target` has no rate of its own for: say they are not exported."""
    warn_activation_dropout(config, target)
    embedder, block = config.embedder.dropout, config.layers.block.dropout
    if embedder != block:
        logger.warning(
            "%s has one dropout for the embeddings and the sub-layer outputs: embedder.dropout "
            "%s is exported as the blocks' %s (inference is unaffected)",
            target,
            embedder,
            block,
        )


@dataclass(frozen=True)
class MaskedLMKeys:
    """Where a family keeps its masked-LM head (`zoo.nn.MaskedLMHead`)."""

    transform: str  # the dense layer before the norm
    norm: str  # its LayerNorm
    bias: str  # the output bias over the vocabulary
    decoder: str  # the decoder Linear, whose weight is the tied token embedding table
    bias_aliases: tuple[str, ...] = ()  # tied copies of the bias


class Bert(Architecture[ClassifierConfig]):
    name = "bert"
    model_type = "bert"
    loads: tuple[str, ...] = (
        "BertForSequenceClassification",
        "BertModel",
        "BertForPreTraining",
        "BertForMaskedLM",
    )
    export_class = "BertForSequenceClassification"
    mlm_class = "BertForMaskedLM"  # the export class of a model with a masked-LM head
    prefix = "bert."
    config_class = "BertConfig"
    zoo_config_class = ClassifierConfig
    zoo_base = BERT
    head = "classifier"  # the class-logits Linear
    pooler_activation = "tanh"  # the pooler's (the head's dense layer's) nonlinearity
    pooler_in_head = False  # True: the pooler belongs to the task head (fresh in a bare model)
    pretraining_heads: tuple[str, ...] = (r"cls\..*",)  # regexes: heads zoo loads only whole
    mlm = MaskedLMKeys(
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        "cls.predictions.decoder",
        bias_aliases=("cls.predictions.decoder.bias",),
    )

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def pooler_key(self) -> str:
        """The Linear the zoo pooler maps to (dense + tanh on the first token)."""
        return f"{self.prefix}pooler.dense"

    def ignored(self) -> list[str]:
        """Regexes of checkpoint keys that carry nothing zoo computes."""
        # pretraining heads (next sentence, a masked LM not loaded) and old position-id buffers
        prefix = re.escape(self.prefix)
        return [*self.pretraining_heads, rf"{prefix}embeddings\.position_ids"]

    def task_weights(self, hf_class: str) -> tuple[str, ...]:
        if hf_class.endswith("ForSequenceClassification"):
            return (f"{self.head}.weight", f"{self.head}.bias")
        if hf_class.endswith("ForMaskedLM"):
            return (f"{self.mlm.transform}.weight", self.mlm.bias)
        return ()

    def num_classes(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> int:
        """Rows of the checkpoint's head, else the labels its config names, else 2."""
        head = shapes.get(f"{self.head}.weight")
        labels = hf["id2label"]
        return head[0] if head is not None else (len(labels) if labels else 2)

    def pooler(self, present: bool) -> Pooler | None:
        """The zoo pooler of a checkpoint that has (or lacks) the family's pooler weights."""
        return Pooler(activation=self.pooler_activation) if present else None

    def head_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        """Fields of the heads: classes, pooler, masked LM (an MLM checkpoint gets a fresh
        pooler, as transformers' sequence classifier would)."""
        masked_lm = f"{self.mlm.transform}.weight" in shapes
        if masked_lm:
            hf.require(
                "tie_word_embeddings", (True,), "zoo ties the masked-LM decoder to the embeddings"
            )
        if masked_lm and f"{self.head}.weight" not in shapes:
            logger.warning(
                "%s: a masked-LM checkpoint has no classification head: zoo.Classifier's head "
                "(and the dense layer before it) are initialised fresh; fine-tune them before "
                "classifying, or use the masked-LM head (masked_lm_logits)",
                self.name,
            )
        if hf["problem_type"] == "multi_label_classification":
            logger.warning(
                "%s: problem_type='multi_label_classification': the logits are the same, but "
                "train them with a sigmoid (binary cross-entropy) loss, not softmax",
                self.name,
            )
        pooler = f"{self.pooler_key()}.weight" in shapes or masked_lm
        return {
            "head.num_classes": self.num_classes(hf, shapes),
            "head.pooler": self.pooler(pooler),
            "masked_lm": masked_lm,
        }

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        hf.require(
            "position_embedding_type",
            ("absolute",),
            "zoo implements absolute (learned) positions only",
        )
        hf.require("is_decoder", (False,), "zoo.Classifier is a bidirectional encoder")
        hf.require("add_cross_attention", (False,), "zoo.Classifier has no cross-attention")
        dropout, eps = hf["hidden_dropout_prob"], hf["layer_norm_eps"]
        classifier_dropout = hf["classifier_dropout"]
        return {
            "vocab_size": hf["vocab_size"],
            "d_model": hf["hidden_size"],
            "max_positions": hf["max_position_embeddings"],
            "init_std": hf["initializer_range"],
            "pad_id": hf.token_id("pad_token_id", hf["vocab_size"]),
            "num_layers": hf["num_hidden_layers"],
            "attention.num_heads": hf["num_attention_heads"],
            "attention.dropout": hf["attention_probs_dropout_prob"],
            "feed_forward.d_ff": hf["intermediate_size"],
            "feed_forward.activation": hf.activation("hidden_act"),
            "feed_forward.dropout": 0.0,  # BERT's intermediate layer has no dropout
            "norm.eps": eps,
            "layers.block.dropout": dropout,
            "embedder.dropout": dropout,
            "embedder.norm.eps": eps,
            "embedder.type_vocab_size": hf["type_vocab_size"],
            "head.pooling": "first",
            "head.dropout": dropout if classifier_dropout is None else classifier_dropout,
            **self.head_fields(hf, shapes),
        }

    def check_export(
        self, config: ClassifierConfig, expected: Mapping[str, object] | None = None
    ) -> None:
        """Refuse a config the export class cannot express (`expected`: the family's own
        paths and the values it needs, beside BERT's)."""
        refuse_layer_overrides(config, self.export_class)
        check_encoder_parts(config, self.export_class)
        eps = config.layers.block.norm.eps
        fields: dict[str, object] = {
            "norm_first": False,
            "output_norm": False,
            "norm.kind": "layernorm",
            "norm.weight_offset": 0.0,
            "norm.bias": True,
            "attention.qkv_bias": True,
            "attention.output_bias": True,
            "attention.rope": None,
            "attention.window": None,
            "feed_forward.kind": "dense",
            "feed_forward.bias": True,
            "embedder.positions": "learned",
            "embedder.scale": False,
            "embedder.norm": NormSettings(eps=eps),  # one layer_norm_eps for every LayerNorm
            "embedder.position_offset": 0,
            "head.pooling": "first",
        }
        if not config.masked_lm:  # the masked-LM class has no pooler
            fields["head.pooler"] = self.pooler(True)
        require_fields(config, self.export_class, {**fields, **(expected or {})})
        warn_dropouts(config, self.export_class)

    def export_classes(self, config: ClassifierConfig) -> HFDict:
        """`architectures` and the labels of the exported config."""
        return dict(
            architectures=[self.mlm_class if config.masked_lm else self.export_class],
            id2label={str(i): f"LABEL_{i}" for i in range(config.num_classes)},
            label2id={f"LABEL_{i}": i for i in range(config.num_classes)},
        )

    def hf_config(self, config: ClassifierConfig) -> HFDict:
        self.check_export(config)
        if config.embedder.type_vocab_size < 1:
            raise UnsupportedExport(
                f"{self.export_class} always has token-type embeddings: "
                "embedder.type_vocab_size=0 cannot be exported"
            )
        block = config.layers.block
        return dict(
            model_type=self.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=dense_feed_forward(config, self.export_class).d_ff,
            hidden_act=export_activation(config),
            hidden_dropout_prob=block.dropout,
            attention_probs_dropout_prob=block.attention.dropout,
            classifier_dropout=config.head.dropout,
            max_position_embeddings=config.max_positions,
            type_vocab_size=config.embedder.type_vocab_size,
            layer_norm_eps=block.norm.eps,
            initializer_range=config.init_std,
            pad_token_id=config.pad_id,
            **self.export_classes(config),
        )

    def embedding_rules(self, config: ClassifierConfig) -> list[Rule]:
        p = self.prefix
        tied = (f"{self.mlm.decoder}.weight",) if config.masked_lm else ()
        rules = [
            rule(f"{p}embeddings.word_embeddings.weight", "embedder.token_weight", aliases=tied),
            rule(f"{p}embeddings.position_embeddings.weight", "embedder.position_weight"),
            *weight_and_bias(f"{p}embeddings.LayerNorm", "embedder.norm"),
        ]
        if config.embedder.type_vocab_size > 0:
            rules.append(
                rule(f"{p}embeddings.token_type_embeddings.weight", "embedder.token_type_weight")
            )
        return rules

    def layer_rules(self, i: int) -> list[Rule]:
        hf, zoo = f"{self.prefix}encoder.layer.{i}.", f"encoder.{i}."
        return [
            *weight_and_bias(f"{hf}attention.self.query", f"{zoo}self_attention.query_proj"),
            *weight_and_bias(f"{hf}attention.self.key", f"{zoo}self_attention.key_proj"),
            *weight_and_bias(f"{hf}attention.self.value", f"{zoo}self_attention.value_proj"),
            *weight_and_bias(f"{hf}attention.output.dense", f"{zoo}self_attention.output_proj"),
            *weight_and_bias(f"{hf}attention.output.LayerNorm", f"{zoo}self_attention_norm"),
            *weight_and_bias(f"{hf}intermediate.dense", f"{zoo}feed_forward.hidden"),
            *weight_and_bias(f"{hf}output.dense", f"{zoo}feed_forward.output"),
            *weight_and_bias(f"{hf}output.LayerNorm", f"{zoo}feed_forward_norm"),
        ]

    def key_map(
        self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        rules = self.embedding_rules(config)
        for i in range(config.num_layers):
            rules += self.layer_rules(i)
        ignore = self.ignored()
        exporting = shapes is None
        if config.masked_lm:
            m = self.mlm
            rules += [
                *weight_and_bias(m.transform, "mlm_head.transform"),
                *weight_and_bias(m.norm, "mlm_head.norm"),
                rule(m.bias, "mlm_head.bias", aliases=m.bias_aliases),
            ]
        else:
            self._warn_pretraining_heads(shapes or {})
        if config.masked_lm and exporting:
            return KeyMap(rules, ignore=tuple(ignore))  # the MLM class has no pooler or head
        if config.head.pooler is not None:  # a masked-LM checkpoint has none: it starts fresh
            mlm_checkpoint = f"{self.mlm.transform}.weight" in (shapes or {})
            optional = mlm_checkpoint or self.pooler_in_head
            rules += weight_and_bias(self.pooler_key(), "pooler", optional=optional)
        if self._load_head(config, shapes):
            rules += weight_and_bias(self.head, "head", optional=True)
        else:
            ignore.append(rf"{self.head}\..*")
        return KeyMap(rules, ignore=tuple(ignore))

    def _warn_pretraining_heads(self, shapes: Mapping[str, Shape]) -> None:
        found = sorted(
            {
                ".".join(k.split(".")[:2])
                for k in shapes
                if any(re.fullmatch(pattern, k) for pattern in self.pretraining_heads)
            }
        )
        if found:
            logger.warning(
                "%s: the checkpoint's pretraining heads (%s) are not part of zoo.Classifier "
                "and are left out (load the masked-LM head with a checkpoint that has all of "
                "it)",
                self.name,
                ", ".join(found),
            )

    def _load_head(self, config: ClassifierConfig, shapes: Mapping[str, Shape] | None) -> bool:
        if shapes is None or f"{self.head}.weight" not in shapes:
            return True  # exporting, or no head to load: the optional rule leaves it fresh
        rows = shapes[f"{self.head}.weight"][0]
        if rows == config.num_classes:
            return True
        logger.warning(
            "%s: the checkpoint's classification head has %d classes but num_classes=%d: "
            "the head is initialised afresh (train it before use)",
            self.name,
            rows,
            config.num_classes,
        )
        return False
