"""RoBERTa and XLM-RoBERTa (`*ForSequenceClassification`, `*Model`, `*ForMaskedLM`) <->
`zoo.Classifier`.

RoBERTa is BERT with three differences, all configuration: positions start at `pad_id + 1`
and count real tokens only (transformers' `create_position_ids_from_input_ids`: zoo's
`position_offset`), one token type, and a classification head of dense + tanh + out_proj on the
first token, which is zoo's pooler + head (`classifier.dense` -> `pooler`, `classifier.out_proj`
-> `head`). A bare `RobertaModel`'s own pooler is not used by the sequence classifier, so it is
left out and the head's dense starts fresh, as in transformers. The masked-LM head is `lm_head`
(exact GELU whatever `hidden_act` says). XLM-R is the same network with another vocabulary.

Training differs in one detail: RoBERTa's head also drops out the first token's vector before
its dense layer; zoo drops out only after it. Inference is identical.
"""

from __future__ import annotations

from collections.abc import Mapping

from zoo.interop.architecture import ConfigFields, HFConfig, UnsupportedConfig, UnsupportedExport
from zoo.interop.architectures.bert import DEFAULTS, Bert, MaskedLMKeys
from zoo.interop.files import HFDict
from zoo.interop.rules import Shape
from zoo.models import ClassifierConfig
from zoo.presets.parts import BERT, ROBERTA, with_parts


class Roberta(Bert):
    name = "roberta"
    model_type = "roberta"
    loads = ("RobertaForSequenceClassification", "RobertaModel", "RobertaForMaskedLM")
    export_class = "RobertaForSequenceClassification"
    mlm_class = "RobertaForMaskedLM"
    prefix = "roberta."
    config_class = "RobertaConfig"
    zoo_base = with_parts(BERT, ROBERTA)
    head = "classifier.out_proj"
    pooler_in_head = True
    pretraining_heads = (r"lm_head\..*",)
    mlm = MaskedLMKeys(
        "lm_head.dense",
        "lm_head.layer_norm",
        "lm_head.bias",
        "lm_head.decoder",
        bias_aliases=("lm_head.decoder.bias",),
    )

    def hf_defaults(self) -> HFDict:
        return {**DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}

    def pooler_key(self) -> str:
        return "classifier.dense"

    def ignored(self) -> list[str]:
        return [*super().ignored(), r"roberta\.pooler\..*"]  # unused by the sequence classifier

    def head_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        fields = super().head_fields(hf, shapes)
        if fields["masked_lm"] and hf["hidden_act"] != "gelu":
            hf.refuse("hidden_act", f"{self.mlm_class}'s lm_head always uses exact gelu")
        # the head's dense; fresh when the checkpoint lacks it
        return {**fields, "head.pooler": self.pooler(True)}

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        fields = super().zoo_fields(hf, shapes)
        pad_id = fields["pad_id"]
        if not isinstance(pad_id, int):  # None: outside the vocabulary
            raise UnsupportedConfig(
                f"{self.name}: positions start at pad_token_id + 1, so pad_token_id must be a "
                f"token of the vocabulary; got {hf['pad_token_id']!r}"
            )
        return {**fields, "embedder.position_offset": pad_id + 1}

    def check_export(
        self, config: ClassifierConfig, expected: Mapping[str, object] | None = None
    ) -> None:
        if config.pad_id is None:
            raise UnsupportedExport(
                f"{self.export_class} counts positions from pad_id + 1: pad_id=None cannot be "
                "exported"
            )
        activation = config.layers.block.feed_forward.activation
        if config.masked_lm and activation != "gelu":
            raise UnsupportedExport(
                f"{self.mlm_class}'s lm_head uses exact gelu: feed_forward.activation="
                f"{activation!r} cannot be exported"
            )
        offset = {"embedder.position_offset": config.pad_id + 1}
        super().check_export(config, {**offset, **(expected or {})})


class XLMRoberta(Roberta):
    name = "xlm-roberta"
    model_type = "xlm-roberta"
    loads = ("XLMRobertaForSequenceClassification", "XLMRobertaModel", "XLMRobertaForMaskedLM")
    export_class = "XLMRobertaForSequenceClassification"
    mlm_class = "XLMRobertaForMaskedLM"
    config_class = "XLMRobertaConfig"

    def hf_defaults(self) -> HFDict:
        return {**DEFAULTS, "pad_token_id": 1}
