"""T5, T5 v1.1 and FLAN-T5 (`T5ForConditionalGeneration`, `T5Model`) <-> `zoo.Translator`.

T5 is a pre-norm encoder-decoder with RMSNorm (its "LayerNorm" has no mean and no bias), no
biases anywhere, unscaled attention scores, and relative positions: a `[buckets, heads]` table
in the first block of each stack (`relative_attention_bias`), bidirectional in the encoder and
causal in the decoder, whose bias every layer of that stack adds to its scores. One token
table (`shared`) serves encoder and decoder; decoding starts from the pad id. In zoo this is
`zoo.presets.parts.T5`: relative positions are `TranslatorConfig.relative`, the unscaled
scores `attention.scale_dim=1.0`, the decoder its own plan (`decoder`, with cross-attention
of the self-attention's settings), the head `TranslatorHead(tie, scale)`.

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
from zoo.interop.architectures.seq2seq import shared_block
from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Rule, Shape, rule
from zoo.models import TranslatorConfig
from zoo.models.translator import TranslatorHead
from zoo.nn.block import BlockSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.relative_position import RelativePositions
from zoo.presets.parts import T5 as T5_PARTS
from zoo.presets.parts import T5_V1_1, with_parts

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
# T5's fixed parts, which `zoo_base` has: what exporting requires of a zoo config (short
# paths are checked in both stacks' blocks)
PARTS: ConfigFields = {
    "embedder.positions": "none",  # the positions are `relative`, a bias on the scores
    "embedder.scale": False,
    "embedder.norm": None,
    "norm.kind": "rmsnorm",  # T5's "LayerNorm" has no mean and no bias
    "norm.weight_offset": 0.0,
    "norm_first": True,
    "output_norm": False,
    "attention_norm": True,
    "attention.qkv_bias": False,
    "attention.output_bias": False,
    "attention.qk_norm": None,
    "attention.scale_dim": 1.0,  # unscaled scores
    "attention.softcap": None,
    "attention.rope": None,
    "attention.window": None,
    "feed_forward.bias": False,
    "share_embeddings": True,
    "head.bias": False,
}


def feed_forward_fields(hf: HFConfig) -> ConfigFields:
    """`feed_forward.kind` and `.activation` from `feed_forward_proj` ("relu", "gated-gelu")."""
    value = hf["feed_forward_proj"]
    parts = str(value).split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        hf.refuse("feed_forward_proj", "it should be ACT or gated-ACT, e.g. relu or gated-gelu")
    # transformers' rule: "gated-gelu" is the tanh GELU; any other name is that activation
    name = "gelu_new" if value == "gated-gelu" else parts[-1]
    if name not in HF_ACTIVATIONS:
        hf.refuse("feed_forward_proj", f"zoo implements the activations {sorted(HF_ACTIVATIONS)}")
    return {
        "feed_forward.kind": "gated" if gated else "dense",
        "feed_forward.activation": HF_ACTIVATIONS[name],
    }


def export_feed_forward(feed_forward: FeedForwardSettings) -> str:
    """`feed_forward_proj` of a feed-forward's settings."""
    activation = feed_forward.activation
    if feed_forward.kind == "dense":
        return ZOO_TO_HF_ACTIVATION[activation]
    if activation == "gelu":
        raise UnsupportedExport(
            "T5ForConditionalGeneration's gated-gelu is the tanh GELU: this model's gated exact "
            "GELU (feed_forward.activation='gelu') cannot be expressed; use activation='gelu_tanh'"
        )
    return "gated-gelu" if activation == "gelu_tanh" else f"gated-{activation}"


def dropout_rate(config: TranslatorConfig, block: BlockSettings, target: str) -> float:
    """T5's one `dropout_rate`: the blocks'; a warning when the model trains with others."""
    rates = {
        config.embedder.dropout,
        block.dropout,
        block.attention.dropout,
        activation_dropout(config),
        config.decoder.block.dropout,
        config.decoder.block.attention.dropout,
    }
    cross = config.decoder.block.cross_attention
    if cross is not None:
        rates.add(cross.dropout)
    if rates != {block.dropout} or not config.final_dropout:
        logger.warning(
            "%s has one dropout_rate everywhere: exported as dropout=%s (inference is unaffected)",
            target,
            block.dropout,
        )
    return block.dropout


class T5(Architecture[TranslatorConfig]):
    name = "t5"
    model_type = "t5"
    loads: tuple[str, ...] = ("T5ForConditionalGeneration", "T5WithLMHeadModel", "T5Model")
    export_class = "T5ForConditionalGeneration"
    prefix = ""
    config_class = "T5Config"
    zoo_config_class = TranslatorConfig
    zoo_base = T5_PARTS

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
        return {
            "vocab_size": vocab,
            "d_model": hf["d_model"],
            "num_heads": hf["num_heads"],  # the self- and cross-attention's
            "attention.head_dim": hf["d_kv"],
            "cross_attention.head_dim": hf["d_kv"],
            "layers.num_layers": hf["num_layers"],
            "decoder.num_layers": hf["num_decoder_layers"] or hf["num_layers"],
            "d_ff": hf["d_ff"],
            **feed_forward_fields(hf),
            "max_positions": hf["n_positions"] or DEFAULTS["n_positions"],
            "pad_id": pad,
            "bos_id": start,
            "eos_id": hf.token_id("eos_token_id", vocab),
            "norm.eps": hf["layer_norm_epsilon"],
            "relative": RelativePositions(
                num_buckets=hf["relative_attention_num_buckets"],
                max_distance=hf["relative_attention_max_distance"],
            ),
            # a head-less checkpoint (T5Model, or transformers 5's tied save) uses the table
            "head": TranslatorHead(tie=bool(scale) or HEAD not in shapes, scale=bool(scale)),
            "dropout": rate,  # the embeddings', the blocks' and the feed-forward hidden's
            "attention_dropout": rate,
        }

    def hf_config(self, config: TranslatorConfig) -> HFDict:
        target = self.export_class
        block = shared_block(config, target)
        require_fields(config, target, PARTS)
        feed_forward = block.feed_forward
        assert isinstance(feed_forward, FeedForwardSettings)  # shared_block refuses experts
        attention = block.attention
        if config.relative is None:
            raise UnsupportedExport(
                f"{target} has relative positions: this model has relative=None"
            )
        if attention.kv_heads != attention.num_heads:
            raise UnsupportedExport(
                f"{target} has one key/value head per query head, but this model has "
                f"attention.num_kv_heads={attention.num_kv_heads}"
            )
        if config.head.scale and not config.head.tie:
            raise UnsupportedExport(
                f"{target} rescales the decoder output (head.scale=True) only with a head tied "
                "to the token table; set head.tie=True or head.scale=False"
            )
        if config.pad_id is None:
            raise UnsupportedExport(f"{target} needs a pad id: pad_id=None")
        return dict(
            model_type=self.model_type,
            architectures=[target],
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            d_kv=config.head_dim,
            d_ff=feed_forward.d_ff,
            num_layers=config.layers.num_layers,
            num_decoder_layers=config.decoder.num_layers,
            num_heads=attention.num_heads,
            relative_attention_num_buckets=config.relative.num_buckets,
            relative_attention_max_distance=config.relative.max_distance,
            dropout_rate=dropout_rate(config, block, target),
            layer_norm_epsilon=block.norm.eps,
            feed_forward_proj=export_feed_forward(feed_forward),
            n_positions=config.max_positions,
            pad_token_id=config.pad_id,
            eos_token_id=config.eos_id,
            decoder_start_token_id=config.bos_id,
            is_encoder_decoder=True,
            # transformers 4 reads the head from tie_word_embeddings, transformers 5 from
            # scale_decoder_outputs (and unties a head whose weights differ from the table)
            tie_word_embeddings=config.head.tie and config.head.scale,
            scale_decoder_outputs=config.head.scale,
        )

    def transformers_config(self, transformers: ModuleType, config: TranslatorConfig) -> Any:
        hf_config = super().transformers_config(transformers, config)
        # transformers 5 ties the head to the table whatever the config says; a model built
        # from this object keeps its own lm_head only when told so after construction
        hf_config.tie_word_embeddings = config.head.tie
        return hf_config

    def key_map(
        self, config: TranslatorConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        tied = config.head.tie
        copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
        head = (HEAD,) if tied else ()
        rules = [rule("shared.weight", "source_embedder.token_weight", aliases=copies + head)]
        if not tied:
            rules.append(rule(HEAD, "output_proj.weight"))
        for side, plan in (("encoder", config.layers), ("decoder", config.decoder)):
            cross = side == "decoder"
            for i, settings in enumerate(plan.layers()):
                gated = (
                    isinstance(settings.feed_forward, FeedForwardSettings)
                    and settings.feed_forward.kind == "gated"
                )
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
    zoo_base = with_parts(T5_PARTS, T5_V1_1)

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
