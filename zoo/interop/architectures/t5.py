"""T5, T5 v1.1 and FLAN-T5 (`T5ForConditionalGeneration`, `T5Model`) <-> `zoo.Translator`.

T5 is a pre-norm encoder-decoder with RMSNorm (its "LayerNorm" has no mean and no bias), no
biases anywhere, unscaled attention scores, and relative positions: a `[buckets, heads]` table
in the first block of each stack (`relative_attention_bias`), bidirectional in the encoder and
causal in the decoder, whose bias every layer of that stack adds to its scores. One token
table (`shared`) serves encoder and decoder; decoding starts from the pad id.

The versions differ in two switches:

| version      | feed_forward_proj | feed-forward (`DenseReluDense`) | head                          |
| ------------ | ----------------- | ------------------------------- | ----------------------------- |
| T5 (v1.0)    | relu              | `wi`, `wo`                      | tied, output x d_model^-0.5   |
| v1.1, FLAN   | gated-gelu        | `wi_0` (gate), `wi_1` (up), `wo` | untied `lm_head`, no rescale |

`tie_word_embeddings=false` in a hub `config.json` means the v1.1 head; transformers 5 writes
`scale_decoder_outputs` instead (and `tie_word_embeddings=true` whatever the head), which wins
when present. A head-less checkpoint (`T5Model`) of a v1.1 model gets the shared table as its
head, as transformers 5 does.

mT5 (`MT5ForConditionalGeneration`) is T5 v1.1 with a 250,112-token multilingual vocabulary:
its head is never rescaled, and its `lm_head` is its own whatever `tie_word_embeddings` says
(hub configs say false; transformers 5 writes true but keeps a stored head). A zoo model loaded
from mT5 exports as `T5ForConditionalGeneration` with `scale_decoder_outputs=false`: the same
network, which transformers loads with the same logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from zoo.interop.architecture import (
    HF_ACTIVATIONS,
    ZOO_TO_HF_ACTIVATION,
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    activation_dropout,
    logger,
    require_fields,
)
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, rule
from zoo.models import TranslatorConfig

# transformers' T5Config defaults (n_positions: the hub configs' 512, which T5 was trained on)
DEFAULTS: HFDict = dict(
    vocab_size=32128,
    d_model=512,
    d_kv=64,
    d_ff=2048,
    num_layers=6,
    num_decoder_layers=None,
    num_heads=8,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_rate=0.1,
    layer_norm_epsilon=1e-6,
    feed_forward_proj="relu",
    is_encoder_decoder=True,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=None,
    tie_word_embeddings=True,
    scale_decoder_outputs=None,
    is_decoder=False,
    n_positions=512,
)
# model types of T5's relatives that zoo refuses, and why
REFUSED_MODEL_TYPES = {
    "umt5": (
        "UMT5 gives every layer its own relative position table; zoo.Translator shares one "
        "table per stack, as T5 does"
    ),
    "longt5": "LongT5's local and transient-global attention is not implemented",
}
HEAD = "lm_head.weight"


def feed_forward_fields(hf: HFConfig) -> ConfigFields:
    """`feed_forward` and `activation` from `feed_forward_proj` ("relu", "gated-gelu", ...)."""
    value = hf["feed_forward_proj"]
    parts = str(value).split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        hf.refuse("feed_forward_proj", "it should be ACT or gated-ACT, e.g. relu or gated-gelu")
    # transformers' rule: "gated-gelu" is the tanh GELU; any other name is that activation
    name = "gelu_new" if value == "gated-gelu" else parts[-1]
    if name not in HF_ACTIVATIONS:
        hf.refuse("feed_forward_proj", f"zoo implements the activations {sorted(HF_ACTIVATIONS)}")
    return dict(feed_forward="gated" if gated else "dense", activation=HF_ACTIVATIONS[name])


def export_feed_forward(config: TranslatorConfig) -> str:
    if config.feed_forward == "dense":
        return ZOO_TO_HF_ACTIVATION[config.activation]
    if config.activation == "gelu":
        raise UnsupportedExport(
            "T5ForConditionalGeneration's gated-gelu is the tanh GELU: this model's gated exact "
            "GELU (activation='gelu') cannot be expressed; use activation='gelu_tanh'"
        )
    return "gated-gelu" if config.activation == "gelu_tanh" else f"gated-{config.activation}"


class T5(Architecture[TranslatorConfig]):
    name = "t5"
    model_type = "t5"
    loads: tuple[str, ...] = ("T5ForConditionalGeneration", "T5WithLMHeadModel", "T5Model")
    export_class = "T5ForConditionalGeneration"
    prefix = ""
    config_class = "T5Config"
    zoo_config_class = TranslatorConfig

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        hf.require("is_decoder", (False,), "zoo.Translator is an encoder-decoder")
        hf.require("is_encoder_decoder", (True,), "zoo.Translator is an encoder-decoder")
        vocab = hf["vocab_size"]
        pad = hf.token_id("pad_token_id", vocab)
        start = hf.token_id("decoder_start_token_id", vocab)
        start = pad if start is None else start  # T5 starts decoding from the pad id
        if start is None:
            hf.refuse("decoder_start_token_id", "decoding needs a start token in the vocabulary")
        scale = hf["scale_decoder_outputs"]
        if scale is None:  # a transformers 4 config: a tied head is the rescaled v1.0 one
            scale = hf["tie_word_embeddings"] is not False
        rate = float(hf["dropout_rate"])
        return dict(
            vocab_size=vocab,
            d_model=hf["d_model"],
            num_heads=hf["num_heads"],
            attention_head_dim=hf["d_kv"],
            num_layers=hf["num_layers"],
            num_decoder_layers=hf["num_decoder_layers"] or hf["num_layers"],
            d_ff=hf["d_ff"],
            **feed_forward_fields(hf),
            max_positions=hf["n_positions"] or DEFAULTS["n_positions"],
            pad_id=pad,
            bos_id=start,
            eos_id=hf.token_id("eos_token_id", vocab),
            norm="rmsnorm",
            norm_first=True,
            layer_norm_eps=hf["layer_norm_epsilon"],
            use_bias=False,
            positions="relative",
            relative_buckets=hf["relative_attention_num_buckets"],
            relative_max_distance=hf["relative_attention_max_distance"],
            scale_scores=False,
            scale_embeddings=False,
            embedding_norm=False,
            share_embeddings=True,
            # a head-less checkpoint (T5Model, or transformers 5's tied save) uses the table
            tie_output=bool(scale) or HEAD not in shapes,
            scale_output=bool(scale),
            output_bias=False,
            final_dropout=True,
            dropout=rate,
            attention_dropout=rate,
            activation_dropout=rate,
        )

    def hf_config(self, config: TranslatorConfig) -> HFDict:
        require_fields(
            config,
            self.export_class,
            norm="rmsnorm",
            norm_first=True,
            positions="relative",
            scale_scores=False,
            scale_embeddings=False,
            embedding_norm=False,
            share_embeddings=True,
            output_bias=False,
            qk_norm=False,
            sliding_window=None,
        )
        biases = dict(
            use_bias=config.use_bias,
            qkv_bias=config.qkv_bias,
            attention_output_bias=config.attention_output_bias,
            feed_forward_bias=config.feed_forward_bias,
        )
        if any(biases.values()):
            on = ", ".join(f"{name}={value}" for name, value in biases.items() if value)
            raise UnsupportedExport(f"{self.export_class} has no biases, but this model has {on}")
        if config.kv_heads != config.num_heads:
            raise UnsupportedExport(
                f"{self.export_class} has one key/value head per query head, but this model has "
                f"num_kv_heads={config.num_kv_heads}"
            )
        if config.scale_output and not config.tie_output:
            raise UnsupportedExport(
                f"{self.export_class} rescales the decoder output (scale_output=True) only "
                "with a head tied to the token table; set tie_output=True or scale_output=False"
            )
        if config.pad_id is None:
            raise UnsupportedExport(f"{self.export_class} needs a pad id: pad_id=None")
        rates = {config.attention_dropout, activation_dropout(config)}
        if rates != {config.dropout} or not config.final_dropout:
            logger.warning(
                "%s has one dropout_rate everywhere: exported as dropout=%s (inference is "
                "unaffected)",
                self.export_class,
                config.dropout,
            )
        return dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            d_kv=config.head_dim,
            d_ff=config.d_ff,
            num_layers=config.num_layers,
            num_decoder_layers=config.decoder_layers,
            num_heads=config.num_heads,
            relative_attention_num_buckets=config.relative_buckets,
            relative_attention_max_distance=config.relative_max_distance,
            dropout_rate=config.dropout,
            layer_norm_epsilon=config.layer_norm_eps,
            feed_forward_proj=export_feed_forward(config),
            n_positions=config.max_positions,
            pad_token_id=config.pad_id,
            eos_token_id=config.eos_id,
            decoder_start_token_id=config.bos_id,
            is_encoder_decoder=True,
            # transformers 4 reads the head from tie_word_embeddings, transformers 5 from
            # scale_decoder_outputs (and unties a head whose weights differ from the table)
            tie_word_embeddings=config.tie_output and config.scale_output,
            scale_decoder_outputs=config.scale_output,
        )

    def transformers_config(self, transformers: ModuleType, config: TranslatorConfig) -> Any:
        hf_config = super().transformers_config(transformers, config)
        # transformers 5 ties the head to the table whatever the config says; a model built
        # from this object keeps its own lm_head only when told so after construction
        hf_config.tie_word_embeddings = config.tie_output
        return hf_config

    def key_map(
        self, config: TranslatorConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
        head = (HEAD,) if config.tie_output else ()
        rules = [rule("shared.weight", "source_embedder.token_weight", aliases=copies + head)]
        if not config.tie_output:
            rules.append(rule(HEAD, "output_proj.weight"))
        gated = config.feed_forward == "gated"
        for side, layers, cross in (
            ("encoder", config.num_layers, False),
            ("decoder", config.decoder_layers, True),
        ):
            for i in range(layers):
                rules += _block(
                    f"{side}.block.{i}.layer.", f"{side}.{i}.", cross=cross, gated=gated
                )
            rules += [
                rule(
                    f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                    f"{side}_position_bias.weight",
                ),
                rule(f"{side}.final_layer_norm.weight", f"{side}_norm.weight"),
            ]
        # an old key transformers ignores: cross-attention never had a relative bias
        ignore = (r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",)
        return KeyMap(rules, ignore=ignore)


def _block(hf: str, zoo: str, *, cross: bool, gated: bool) -> list[Rule]:
    rules = _attention(f"{hf}0.SelfAttention", f"{zoo}self_attention")
    rules.append(rule(f"{hf}0.layer_norm.weight", f"{zoo}self_attention_norm.weight"))
    if cross:
        rules += _attention(f"{hf}1.EncDecAttention", f"{zoo}cross_attention")
        rules.append(rule(f"{hf}1.layer_norm.weight", f"{zoo}cross_attention_norm.weight"))
    ff, ff_zoo = f"{hf}{2 if cross else 1}", f"{zoo}feed_forward"
    if gated:
        rules += [
            rule(f"{ff}.DenseReluDense.wi_0.weight", f"{ff_zoo}.gate.weight"),
            rule(f"{ff}.DenseReluDense.wi_1.weight", f"{ff_zoo}.hidden.weight"),
        ]
    else:
        rules.append(rule(f"{ff}.DenseReluDense.wi.weight", f"{ff_zoo}.hidden.weight"))
    rules += [
        rule(f"{ff}.DenseReluDense.wo.weight", f"{ff_zoo}.output.weight"),
        rule(f"{ff}.layer_norm.weight", f"{zoo}feed_forward_norm.weight"),
    ]
    return rules


def _attention(hf: str, zoo: str) -> list[Rule]:
    names = (("q", "query"), ("k", "key"), ("v", "value"), ("o", "output"))
    return [rule(f"{hf}.{h}.weight", f"{zoo}.{z}_proj.weight") for h, z in names]


__all__ = ["REFUSED_MODEL_TYPES", "T5"]


class MT5(T5):
    """mT5: the T5 v1.1 network under its own model type and defaults (`MT5Config`)."""

    name = "mt5"
    model_type = "mt5"
    loads = ("MT5ForConditionalGeneration", "MT5Model")
    config_class = "MT5Config"

    def hf_defaults(self) -> HFDict:
        return {
            **DEFAULTS,
            "vocab_size": 250112,
            "d_ff": 1024,
            "num_layers": 8,
            "num_heads": 6,
            "feed_forward_proj": "gated-gelu",
            "decoder_start_token_id": 0,
            "tie_word_embeddings": False,
            # mT5 never rescales its decoder output, whatever tie_word_embeddings says (its
            # configs never carry this key): the head is its own lm_head when stored
            "scale_decoder_outputs": False,
        }
