"""DistilBERT (`DistilBertForSequenceClassification`, `DistilBertModel`, `DistilBertForMaskedLM`)
<-> `zoo.Classifier`.

DistilBERT is BERT without token types and without a pooler (`zoo.presets.parts.DISTILBERT`):
its sequence head is `pre_classifier` + ReLU + dropout + `classifier` on the first token, which
is zoo's pooler with `head.pooler.activation="relu"` and its head. Its own key names:
`distilbert.embeddings.*`, `transformer.layer.N.attention.{q,k,v,out}_lin`, `sa_layer_norm`,
`ffn.lin1`/`lin2`, `output_layer_norm`; its LayerNorm epsilon is fixed at 1e-12, and its
masked-LM head is `vocab_transform` + activation + `vocab_layer_norm` + `vocab_projector` (tied).
"""

from __future__ import annotations

from collections.abc import Mapping

from zoo.interop.architecture import ConfigFields, HFConfig, export_activation
from zoo.interop.architectures.bert import Bert, MaskedLMKeys, dense_feed_forward
from zoo.interop.files import HFDict
from zoo.interop.rules import Rule, Shape, rule, weight_and_bias
from zoo.models import ClassifierConfig
from zoo.presets.parts import BERT, DISTILBERT, with_parts

DEFAULTS: HFDict = dict(
    vocab_size=30522,
    max_position_embeddings=512,
    sinusoidal_pos_embds=False,
    n_layers=6,
    n_heads=12,
    dim=768,
    hidden_dim=3072,
    dropout=0.1,
    attention_dropout=0.1,
    activation="gelu",
    initializer_range=0.02,
    qa_dropout=0.1,
    seq_classif_dropout=0.2,
    pad_token_id=0,
    tie_word_embeddings=True,
    problem_type=None,
)
LAYER_NORM_EPS = 1e-12  # hard-coded in transformers' DistilBERT


class DistilBert(Bert):
    name = "distilbert"
    model_type = "distilbert"
    loads = ("DistilBertForSequenceClassification", "DistilBertModel", "DistilBertForMaskedLM")
    export_class = "DistilBertForSequenceClassification"
    mlm_class = "DistilBertForMaskedLM"
    prefix = "distilbert."
    config_class = "DistilBertConfig"
    zoo_base = with_parts(BERT, DISTILBERT)
    head = "classifier"
    pooler_activation = "relu"
    pooler_in_head = True
    pretraining_heads = (r"vocab_(transform|layer_norm|projector)\..*",)
    mlm = MaskedLMKeys(
        "vocab_transform", "vocab_layer_norm", "vocab_projector.bias", "vocab_projector"
    )

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def pooler_key(self) -> str:
        return "pre_classifier"

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        hf.require(
            "sinusoidal_pos_embds", (False,), "zoo loads DistilBERT's learned position table only"
        )
        dropout = hf["dropout"]
        return {
            "vocab_size": hf["vocab_size"],
            "d_model": hf["dim"],
            "max_positions": hf["max_position_embeddings"],
            "init_std": hf["initializer_range"],
            "pad_id": hf.token_id("pad_token_id", hf["vocab_size"]),
            "num_layers": hf["n_layers"],
            "attention.num_heads": hf["n_heads"],
            "attention.dropout": hf["attention_dropout"],
            "feed_forward.d_ff": hf["hidden_dim"],
            "feed_forward.activation": hf.activation("activation"),
            "feed_forward.dropout": 0.0,  # DistilBERT's feed-forward hidden has no dropout
            "norm.eps": LAYER_NORM_EPS,
            "layers.block.dropout": dropout,
            "embedder.dropout": dropout,
            "embedder.norm.eps": LAYER_NORM_EPS,
            "head.pooling": "first",
            "head.dropout": hf["seq_classif_dropout"],
            # pre_classifier, fresh if absent
            **{**self.head_fields(hf, shapes), "head.pooler": self.pooler(True)},
        }

    def hf_config(self, config: ClassifierConfig) -> HFDict:
        expected = {"embedder.type_vocab_size": 0, "norm.eps": LAYER_NORM_EPS}
        self.check_export(config, expected)
        block = config.layers.block
        return dict(
            model_type=self.model_type,
            vocab_size=config.vocab_size,
            dim=config.d_model,
            n_layers=config.num_layers,
            n_heads=config.num_heads,
            hidden_dim=dense_feed_forward(config, self.export_class).d_ff,
            activation=export_activation(config),
            dropout=block.dropout,
            attention_dropout=block.attention.dropout,
            seq_classif_dropout=config.head.dropout,
            max_position_embeddings=config.max_positions,
            sinusoidal_pos_embds=False,
            initializer_range=config.init_std,
            pad_token_id=config.pad_id,
            **self.export_classes(config),
        )

    def embedding_rules(self, config: ClassifierConfig) -> list[Rule]:
        p = self.prefix
        tied = (f"{self.mlm.decoder}.weight",) if config.masked_lm else ()
        return [
            rule(f"{p}embeddings.word_embeddings.weight", "embedder.token_weight", aliases=tied),
            rule(f"{p}embeddings.position_embeddings.weight", "embedder.position_weight"),
            *weight_and_bias(f"{p}embeddings.LayerNorm", "embedder.norm"),
        ]

    def layer_rules(self, i: int) -> list[Rule]:
        hf, zoo = f"{self.prefix}transformer.layer.{i}.", f"encoder.{i}."
        attention = f"{zoo}self_attention."
        return [
            *weight_and_bias(f"{hf}attention.q_lin", f"{attention}query_proj"),
            *weight_and_bias(f"{hf}attention.k_lin", f"{attention}key_proj"),
            *weight_and_bias(f"{hf}attention.v_lin", f"{attention}value_proj"),
            *weight_and_bias(f"{hf}attention.out_lin", f"{attention}output_proj"),
            *weight_and_bias(f"{hf}sa_layer_norm", f"{zoo}self_attention_norm"),
            *weight_and_bias(f"{hf}ffn.lin1", f"{zoo}feed_forward.hidden"),
            *weight_and_bias(f"{hf}ffn.lin2", f"{zoo}feed_forward.output"),
            *weight_and_bias(f"{hf}output_layer_norm", f"{zoo}feed_forward_norm"),
        ]
