import dataclasses

import jax
import pytest

import zoo
from zoo import ClassifierConfig, GPTConfig, TranslatorConfig
from zoo.nn import AttentionSettings, BlockSettings, EmbedderSettings, FeedForwardSettings


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (GPTConfig, dict(d_model=100, num_heads=12), "not divisible by num_heads"),
        (GPTConfig, dict(activation="swishy"), "unknown activation 'swishy'"),
        (GPTConfig, dict(dropout=-0.1), r"dropout must be in \[0, 1\)"),
        (GPTConfig, dict(num_layers=0), "num_layers must be a positive integer"),
        (GPTConfig, dict(pad_id=50257), "pad_id=50257 is outside the vocabulary"),
        (GPTConfig, dict(positions="alibi"), "positions must be one of"),
        (GPTConfig, dict(dtype="float8"), "dtype must be one of"),
        (GPTConfig, dict(remat="some"), "remat must be one of"),
        (ClassifierConfig, dict(num_classes=0), "num_classes must be a positive integer"),
        (ClassifierConfig, dict(pooling="max"), "pooling must be one of"),
        (
            TranslatorConfig,
            dict(target_vocab_size=100),
            "share_embeddings needs one vocabulary",
        ),
        (TranslatorConfig, dict(eos_id=40000), "eos_id=40000 is outside"),
        (GPTConfig, dict(num_layers=True), r"num_layers=True is a bool; num_layers takes a number"),
        (ClassifierConfig, dict(num_classes=True), "num_classes=True is a bool"),
        (TranslatorConfig, dict(num_decoder_layers=False), "num_decoder_layers=False is a bool"),
        (GPTConfig, dict(eos_id=True), "eos_id=True is a bool"),
        # the parts' own checks, run as the config resolves their settings, name its fields
        (GPTConfig, dict(layer_norm_eps=0.0), "layer_norm_eps must be positive, got 0.0"),
        (GPTConfig, dict(feed_forward="moe"), r"feed_forward kind must be one of \('dense'"),
        (GPTConfig, dict(norm="batchnorm"), "norm must be one of"),
        (GPTConfig, dict(num_heads=0), "num_heads must be a positive integer, got 0"),
        (GPTConfig, dict(d_ff=0), "d_ff must be a positive integer, got 0"),
        (GPTConfig, dict(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (GPTConfig, dict(num_kv_heads=5), "num_kv_heads=5 must divide num_heads=12"),
        (GPTConfig, dict(attention_head_dim=0), "attention_head_dim must be a positive integer"),
        (GPTConfig, dict(attention_implementation="flash"), "attention_implementation must be"),
        (GPTConfig, dict(sinusoid_layout="split"), "sinusoid_layout must be one of"),
        (ClassifierConfig, dict(type_vocab_size=-1), "type_vocab_size must be >= 0"),
    ],
)
def test_invalid_configs_say_what_to_fix(cls, fields, message):
    with pytest.raises(ValueError, match=message):
        cls(**fields)


def test_a_head_width_that_does_not_divide_says_how_to_fix_it():
    with pytest.raises(
        ValueError, match=r"divisors of d_model, e.g. \[1, 2, 4, 5, 10.*attention_head_dim"
    ):
        GPTConfig(d_model=100, num_heads=12)
    assert GPTConfig(d_model=100, num_heads=12, attention_head_dim=8).head_dim == 8


def test_settings_fields_are_named_as_the_config_fields_they_come_from():
    """One name for one thing: every field of a part's settings that a config field sets has
    that field's name (the feed-forward's `kind` is the config's `feed_forward`; the nested
    records, the translator's `own_tokens` and the block's `attention_norm`, which the stack
    sets per kind of layer, are not config fields)."""
    config_fields = {f.name for f in dataclasses.fields(ClassifierConfig)}
    nested = {
        "attention",
        "feed_forward",
        "cross_attention",
        "kind",
        "own_tokens",
        "attention_norm",
    }
    for record in (AttentionSettings, FeedForwardSettings, BlockSettings, EmbedderSettings):
        names = {f.name for f in dataclasses.fields(record)} - nested
        assert names <= config_fields, (record.__name__, names - config_fields)
    config = ClassifierConfig(
        feed_forward="gated", use_bias=False, qkv_bias=True, activation_dropout=0.2
    )
    settings = config.block_settings()
    assert settings.feed_forward.kind == config.feed_forward == "gated"
    assert settings.feed_forward.feed_forward_bias is False
    assert settings.feed_forward.activation_dropout == 0.2
    assert settings.attention.qkv_bias and not settings.attention.attention_output_bias
    assert settings.layer_norm_eps == settings.attention.layer_norm_eps == config.layer_norm_eps
    embedder = config.embedder_settings()
    assert (embedder.positions, embedder.type_vocab_size) == (config.positions, 2)
    assert embedder.embedding_norm and embedder.layer_norm_eps == 1e-12


def test_replace_rejects_unknown_fields_and_lists_valid_ones():
    with pytest.raises(TypeError, match="no field.*'num_head'.*valid fields"):
        GPTConfig().replace(num_head=4)


def test_configs_are_frozen_keyword_only_and_round_trip():
    config = GPTConfig(d_model=64, num_heads=4)
    with pytest.raises(AttributeError):
        config.d_model = 32  # type: ignore[misc]
    with pytest.raises(TypeError):
        GPTConfig(64)  # type: ignore[misc]
    assert GPTConfig.from_dict(config.to_dict()) == config
    assert config.head_dim == 16


def test_translator_derived_sizes():
    config = TranslatorConfig(
        vocab_size=100, target_vocab_size=80, share_embeddings=False, num_decoder_layers=3
    )
    assert config.tgt_vocab == 80 and config.decoder_layers == 3
    assert TranslatorConfig().tgt_vocab == 37000


def test_scale_scores_reaches_every_attention():
    model = zoo.create("translator-tiny", scale_scores=False, key=jax.random.key(0))
    attentions = [
        model.encoder.blocks.self_attention,
        model.decoder.blocks.self_attention,
        model.decoder.blocks.cross_attention,
    ]
    assert [a.scale_scores for a in attentions] == [False, False, False]
    assert zoo.create("gpt-tiny", key=jax.random.key(0)).layers.blocks.self_attention.scale_scores


def test_layer_loop_choices_and_configs_saved_with_scan_layers():
    """`layer_loop` replaced the boolean `scan_layers`: a saved true (the old default) reads
    as "auto" and a saved false as "unroll"."""
    config = GPTConfig()
    assert config.layer_loop == "auto" and config.scan_layers is None
    assert GPTConfig(layer_loop="scan").scan_layers is True
    assert GPTConfig(layer_loop="unroll").scan_layers is False
    with pytest.raises(ValueError, match="layer_loop must be one of"):
        GPTConfig(layer_loop="loop")
    old = {**GPTConfig().to_dict(), "scan_layers": True}
    del old["layer_loop"]
    assert GPTConfig.from_dict(old).layer_loop == "auto"
    assert GPTConfig.from_dict({**old, "scan_layers": False}).layer_loop == "unroll"
    assert GPTConfig.from_dict(GPTConfig(layer_loop="scan").to_dict()).layer_loop == "scan"
