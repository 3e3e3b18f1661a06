"""MarianMT (`MarianMTModel`, `MarianModel`) <-> `zoo.Translator`.

Marian is a post-LN encoder-decoder with fixed sinusoidal positions laid out sines-then-cosines,
token embeddings scaled by sqrt(d_model), one token table shared by encoder, decoder and output
projection, a `final_logits_bias`, and swish (SiLU) feed-forward layers. Decoding starts from
`decoder_start_token_id` (the pad id), which becomes zoo's `bos_id`.

In zoo it is the paper's Transformer (`zoo.presets.parts.TRANSFORMER`) with `PARTS` changed:
the logits bias is `head.bias`, the output projection tied to the table `head.tie`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    activation_dropout,
    export_activation,
    logger,
    require_fields,
)
from zoo.interop.architectures.seq2seq import shared_block
from zoo.interop.files import HFDict
from zoo.interop.rules import ROW, Derived, KeyMap, Rule, Shape, rule, weight_and_bias
from zoo.models import TranslatorConfig
from zoo.models.translator import TranslatorHead
from zoo.presets.parts import TRANSFORMER

DEFAULTS: HFDict = dict(
    vocab_size=58101,
    decoder_vocab_size=None,
    max_position_embeddings=1024,
    encoder_layers=12,
    encoder_ffn_dim=4096,
    encoder_attention_heads=16,
    decoder_layers=12,
    decoder_ffn_dim=4096,
    decoder_attention_heads=16,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    activation_function="gelu",
    d_model=1024,
    dropout=0.1,
    attention_dropout=0.0,
    activation_dropout=0.0,
    init_std=0.02,
    decoder_start_token_id=58100,
    scale_embedding=False,
    pad_token_id=58100,
    eos_token_id=0,
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
    is_decoder=False,
    # options of the older BART-style config that Marian checkpoints still carry
    normalize_before=False,
    normalize_embedding=False,
    layernorm_embedding=False,
    add_final_layer_norm=False,
    add_bias_logits=False,
    static_position_embeddings=True,
)
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which Marian uses everywhere
# MarianMT's fixed parts: what loading sets and exporting requires of a zoo config (short
# paths are checked in both stacks' blocks; the cross-attention has the self-attention's)
PARTS: ConfigFields = {
    "norm_first": False,  # post-LN
    "output_norm": False,
    "attention_norm": True,
    "norm.kind": "layernorm",
    "norm.eps": LAYER_NORM_EPS,
    "norm.bias": True,
    "embedder.positions": "sinusoidal",
    "embedder.sinusoid_layout": "concatenated",  # sines, then cosines
    "embedder.norm": None,
    "attention.qkv_bias": True,
    "attention.output_bias": True,
    "attention.qk_norm": None,
    "attention.scale_dim": None,  # scores / sqrt(head_dim)
    "attention.softcap": None,
    "attention.rope": None,
    "attention.window": None,
    "feed_forward.kind": "dense",
    "feed_forward.bias": True,
    "relative": None,
    "final_dropout": False,
}
# the parts exporting requires besides (loading leaves them at `zoo_base`'s)
EXPORTED_PARTS: ConfigFields = {"head.scale": False}


def sinusoid_table(num_positions: int, dim: int) -> np.ndarray:
    """Marian's fixed position table, computed in float64: sines in the first half, cosines after."""
    half = dim // 2
    inv_freq = 1.0 / np.power(10000.0, 2.0 * np.arange(half) / dim)
    angles = np.arange(num_positions)[:, None] * inv_freq[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


class Marian(Architecture[TranslatorConfig]):
    name = "marian"
    model_type = "marian"
    loads = ("MarianMTModel", "MarianModel")
    export_class = "MarianMTModel"
    prefix = "model."
    config_class = "MarianConfig"
    zoo_config_class = TranslatorConfig
    zoo_base = TRANSFORMER

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def task_weights(self, hf_class: str) -> tuple[str, ...]:
        return ("final_logits_bias",) if hf_class == "MarianMTModel" else ()

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        hf.require("normalize_before", (False,), "zoo's Marian is post-LN")
        for name in ("normalize_embedding", "layernorm_embedding"):
            hf.require(name, (False,), "zoo's Marian has no LayerNorm on the embeddings")
        hf.require("add_final_layer_norm", (False,), "zoo's Marian has no final LayerNorm")
        hf.require("add_bias_logits", (False,), "zoo's Marian has no logits bias layer")
        hf.require("static_position_embeddings", (True,), "zoo's Marian positions are sinusoidal")
        hf.require("is_decoder", (False,), "zoo.Translator is an encoder-decoder")
        for name in ("encoder_layerdrop", "decoder_layerdrop"):
            hf.require(
                name, (0, 0.0), "zoo does not implement LayerDrop; set it to 0 in config.json"
            )
        for encoder, decoder in (
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
        ):
            if hf[encoder] != hf[decoder]:
                hf.refuse(decoder, f"zoo.Translator needs it equal to {encoder}={hf[encoder]}")
        shared = bool(hf["share_encoder_decoder_embeddings"])
        vocab = hf["vocab_size"]
        target_vocab = vocab if shared else (hf["decoder_vocab_size"] or vocab)
        start = hf.token_id("decoder_start_token_id", target_vocab)
        if start is None:
            hf.refuse("decoder_start_token_id", "decoding needs a start token in the vocabulary")
        dropout = hf["dropout"]
        return {
            "vocab_size": vocab,
            "target_vocab_size": None if shared else target_vocab,
            "d_model": hf["d_model"],
            "num_heads": hf["encoder_attention_heads"],  # the self- and cross-attention's
            "layers.num_layers": hf["encoder_layers"],
            "decoder.num_layers": hf["decoder_layers"],
            "d_ff": hf["encoder_ffn_dim"],
            "max_positions": hf["max_position_embeddings"],
            "feed_forward.activation": hf.activation("activation_function"),
            "embedder.dropout": dropout,
            "layers.block.dropout": dropout,
            "decoder.block.dropout": dropout,
            "attention_dropout": hf["attention_dropout"],
            "feed_forward.dropout": hf["activation_dropout"],
            "init_std": hf["init_std"],
            "embedder.scale": bool(hf["scale_embedding"]),
            "share_embeddings": shared,
            "head": TranslatorHead(tie=bool(hf["tie_word_embeddings"]), bias=True),
            "pad_id": hf.token_id("pad_token_id", target_vocab),
            "eos_id": hf.token_id("eos_token_id", target_vocab),
            "bos_id": start,
            **PARTS,
        }

    def hf_config(self, config: TranslatorConfig) -> HFDict:
        target = self.export_class
        block = shared_block(config, target)
        require_fields(config, target, {**PARTS, **EXPORTED_PARTS})
        if config.pad_id is None:
            raise UnsupportedExport(f"{target} needs a pad id: pad_id=None")
        attention = block.attention
        if attention.kv_heads != attention.num_heads:
            raise UnsupportedExport(
                f"{target} has one key/value head per query head, but this model has "
                f"attention.num_kv_heads={attention.num_kv_heads}"
            )
        if attention.width(config.d_model) * attention.num_heads != config.d_model:
            raise UnsupportedExport(
                f"{target}'s heads are d_model // num_heads wide, but this model has "
                f"attention.head_dim={attention.head_dim}"
            )
        if config.embedder.dropout != block.dropout:
            logger.warning(
                "%s has one dropout on the embeddings and the blocks: exported as dropout=%s "
                "(inference is unaffected)",
                target,
                block.dropout,
            )
        heads, d_ff = attention.num_heads, block.feed_forward.d_ff
        return dict(
            model_type=self.model_type,
            architectures=[target],
            vocab_size=config.vocab_size,
            decoder_vocab_size=config.tgt_vocab,
            share_encoder_decoder_embeddings=config.share_embeddings,
            tie_word_embeddings=config.head.tie,
            d_model=config.d_model,
            encoder_layers=config.layers.num_layers,
            decoder_layers=config.decoder.num_layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=d_ff,
            decoder_ffn_dim=d_ff,
            max_position_embeddings=config.max_positions,
            activation_function=export_activation(config),
            dropout=block.dropout,
            attention_dropout=attention.dropout,
            activation_dropout=activation_dropout(config),
            init_std=config.init_std,
            scale_embedding=config.embedder.scale,
            pad_token_id=config.pad_id,
            eos_token_id=config.eos_id,
            forced_eos_token_id=config.eos_id,
            decoder_start_token_id=config.bos_id,
            is_encoder_decoder=True,
        )

    def key_map(
        self, config: TranslatorConfig, shapes: Mapping[str, Shape] | None = None
    ) -> KeyMap:
        tied_output = ("lm_head.weight",) if config.head.tie else ()
        if config.share_embeddings:
            copies = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
            # transformers 5 ties the encoder and decoder tables to `shared` only when
            # tie_word_embeddings is set: an untied output needs the copies written out.
            table = rule(
                "model.shared.weight",
                "source_embedder.token_weight",
                aliases=copies + tied_output,
                write_aliases=not config.head.tie,
            )
            rules = [table]
        else:
            rules = [
                rule("model.encoder.embed_tokens.weight", "source_embedder.token_weight"),
                rule(
                    "model.decoder.embed_tokens.weight",
                    "target_embedder.token_weight",
                    aliases=tied_output,
                ),
            ]
        if not config.head.tie:
            rules.append(rule("lm_head.weight", "output_proj.weight"))
        for i in range(config.layers.num_layers):
            rules += _layer(f"model.encoder.layers.{i}.", f"encoder.{i}.", cross=False)
        for i in range(config.decoder.num_layers):
            rules += _layer(f"model.decoder.layers.{i}.", f"decoder.{i}.", cross=True)

        def positions() -> np.ndarray:
            return sinusoid_table(config.max_positions, config.d_model)

        derived = [
            Derived(f"model.{side}.embed_positions.weight", positions, "fixed sinusoid positions")
            for side in ("encoder", "decoder")
        ]
        if config.head.bias:
            # absent from some checkpoints: transformers then starts it at zero, as zoo does
            rules.append(rule("final_logits_bias", "output_bias", ROW, optional=True))
        else:
            derived.append(
                Derived(
                    "final_logits_bias",
                    lambda: np.zeros((1, config.tgt_vocab)),
                    "a zero logits bias (the zoo model has head.bias=False)",
                    save=True,
                )
            )
        return KeyMap(rules, derived)


def _layer(hf: str, zoo: str, *, cross: bool) -> list[Rule]:
    rules = _attention(f"{hf}self_attn", f"{zoo}self_attention")
    rules += weight_and_bias(f"{hf}self_attn_layer_norm", f"{zoo}self_attention_norm")
    if cross:
        rules += _attention(f"{hf}encoder_attn", f"{zoo}cross_attention")
        rules += weight_and_bias(f"{hf}encoder_attn_layer_norm", f"{zoo}cross_attention_norm")
    rules += weight_and_bias(f"{hf}fc1", f"{zoo}feed_forward.hidden")
    rules += weight_and_bias(f"{hf}fc2", f"{zoo}feed_forward.output")
    rules += weight_and_bias(f"{hf}final_layer_norm", f"{zoo}feed_forward_norm")
    return rules


def _attention(hf: str, zoo: str) -> list[Rule]:
    names = (("q", "query"), ("k", "key"), ("v", "value"), ("out", "output"))
    return [r for h, z in names for r in weight_and_bias(f"{hf}.{h}_proj", f"{zoo}.{z}_proj")]
