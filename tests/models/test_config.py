"""The config tree: checks that name the field, changes by path, short path and alias, the JSON
form, 0.1's flat configs read as today's tree, and fields a flavor does not use refused."""

import dataclasses
import json
from pathlib import Path

import jax
import pytest

import zoo
from zoo import ClassifierConfig, GPTConfig, TranslatorConfig
from zoo.models import FLAVORS
from zoo.nn import (
    AttentionSettings,
    BlockSettings,
    FeedForwardSettings,
    LayerOverride,
    LayerPlan,
    MoESettings,
    NormSettings,
    QKNorm,
    Rope,
)
from zoo.records import to_data

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("cls", "changes", "message"),
    [
        (GPTConfig, dict(d_model=100, num_heads=12), "not divisible by num_heads"),
        (GPTConfig, {"feed_forward.activation": "swishy"}, "unknown activation 'swishy'"),
        (GPTConfig, dict(dropout=-0.1), r"dropout must be in \[0, 1\)"),
        (GPTConfig, dict(num_layers=0), "num_layers must be a positive integer"),
        (GPTConfig, dict(pad_id=50257), "pad_id=50257 is outside the vocabulary"),
        (GPTConfig, {"embedder.positions": "alibi"}, "embedder positions must be one of"),
        (GPTConfig, dict(dtype="float8"), "dtype must be one of"),
        (GPTConfig, dict(remat="some"), "remat must be one of"),
        (ClassifierConfig, dict(num_classes=0), "num_classes must be a positive integer"),
        (ClassifierConfig, {"head.pooling": "max"}, "pooling must be one of"),
        (TranslatorConfig, dict(target_vocab_size=100), "share_embeddings needs one vocabulary"),
        (TranslatorConfig, dict(eos_id=40000), "eos_id=40000 is outside"),
        (GPTConfig, dict(num_layers=True), r"num_layers=True is a bool; num_layers takes a number"),
        (ClassifierConfig, dict(num_classes=True), "num_classes=True is a bool"),
        (GPTConfig, dict(eos_id=True), "eos_id=True is a bool"),
        (GPTConfig, {"norm.eps": 0.0}, "norm eps must be positive, got 0.0"),
        (GPTConfig, {"feed_forward.kind": "moe"}, r"feed_forward kind must be one of \('dense'"),
        (GPTConfig, {"norm.kind": "batchnorm"}, "norm kind must be one of"),
        (GPTConfig, dict(num_heads=0), "num_heads must be a positive integer, got 0"),
        (GPTConfig, dict(d_ff=0), "d_ff must be a positive integer, got 0"),
        (GPTConfig, dict(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (GPTConfig, {"attention.num_kv_heads": 5}, "num_kv_heads=5 must divide num_heads=12"),
        (GPTConfig, {"attention.head_dim": 0}, "head_dim must be a positive integer"),
        (GPTConfig, {"attention.implementation": "flash"}, "attention implementation must be"),
        (GPTConfig, {"embedder.sinusoid_layout": "split"}, "sinusoid_layout must be one of"),
        (ClassifierConfig, {"embedder.type_vocab_size": -1}, "type_vocab_size must be an int"),
        (GPTConfig, {"norm.weight_offset": 1.0}, "weight_offset=1.0 is for an RMSNorm"),
    ],
)
def test_invalid_configs_say_what_to_fix(cls, changes, message):
    with pytest.raises(ValueError, match=message):
        cls().replace(**changes)


def test_a_head_width_that_does_not_divide_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"divisors of d_model, e.g. \[1, 2, 4, 5, 10.*head_dim"):
        GPTConfig(d_model=100)
    config = GPTConfig().replace(d_model=100, **{"attention.head_dim": 8})
    assert config.head_dim == 8


def test_the_config_holds_a_few_fields_and_its_parts():
    """The model-level fields stay few; each part's settings are a record of the part."""
    own = {field.name for field in dataclasses.fields(zoo.models.TransformerConfig)}
    assert own == {
        "vocab_size", "d_model", "max_positions", "pad_id", "dtype", "init_std",
        "layer_loop", "remat", "embedder", "layers",
    }  # fmt: skip
    config = GPTConfig()
    assert isinstance(config.layers, LayerPlan) and config.layers.num_layers == 12
    block = config.layers.block
    assert isinstance(block.attention, AttentionSettings) and block.attention.num_heads == 12
    assert isinstance(block.feed_forward, FeedForwardSettings) and block.feed_forward.d_ff == 3072


def test_a_path_a_short_path_and_an_alias_set_the_same_field():
    base = GPTConfig()
    by_path = base.replace(**{"layers.block.attention.num_kv_heads": 4})
    by_short = base.replace(**{"attention.num_kv_heads": 4})
    assert by_path == by_short and by_short.kv_heads == 4
    assert base.replace(num_heads=8) == base.replace(**{"attention.num_heads": 8})
    assert base.replace(num_layers=3).layers.num_layers == 3


def test_aliases_set_exactly_their_documented_paths():
    assert GPTConfig().paths("dropout") == (
        "embedder.dropout",
        "layers.block.dropout",
        "layers.block.feed_forward.dropout",
    )
    assert ClassifierConfig().paths("dropout")[-1] == "head.dropout"
    translator = TranslatorConfig()
    assert translator.paths("num_layers") == ("layers.num_layers", "decoder.num_layers")
    assert translator.paths("num_heads") == (
        "layers.block.attention.num_heads",
        "decoder.block.attention.num_heads",
        "decoder.block.cross_attention.num_heads",
    )
    changed = translator.replace(num_heads=4, dropout=0.0)
    assert changed.decoder.block.cross_attention.num_heads == 4
    assert changed.embedder.dropout == changed.decoder.block.feed_forward.dropout == 0.0
    mixtral = zoo.presets.get("mixtral-tiny").config
    assert "layers.block.feed_forward.dropout" not in mixtral.paths("dropout")  # experts: none


def test_changes_are_made_together_so_their_order_does_not_matter():
    """12 heads of 4 key/value heads to 10 heads of 5: either change alone is refused."""
    config = GPTConfig(d_model=120).replace(**{"attention.num_kv_heads": 4})
    changes = {"num_heads": 10, "attention.num_kv_heads": 5}
    forward = config.replace(**changes)
    backward = config.replace(**dict(reversed(list(changes.items()))))
    assert forward == backward and (forward.num_heads, forward.kv_heads) == (10, 5)


def test_a_flat_name_of_0_1_says_where_it_went():
    with pytest.raises(ValueError, match="num_kv_heads is attention.num_kv_heads"):
        GPTConfig().replace(num_kv_heads=2)
    with pytest.raises(ValueError, match="sliding_window is attention.window"):
        zoo.create("llama-tiny", sliding_window=3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="no field 'num_head'.*did you mean 'num_heads'"):
        GPTConfig().replace(num_head=4)
    with pytest.raises(ValueError, match="AttentionSettings has no field 'widow'.*'window'"):
        GPTConfig().replace(**{"attention.widow": 4})


def test_json_data_becomes_the_declared_records():
    config = zoo.presets.get("llama-tiny").config.replace(
        **{"attention.qk_norm": {"scope": "projection"}, "attention.rope": {"theta": 500.0}}
    )
    attention = config.layers.block.attention
    assert attention.qk_norm == QKNorm(scope="projection")
    assert attention.rope == Rope(theta=500.0)
    with pytest.raises(ValueError, match="feed_forward needs 'type'"):
        config.replace(feed_forward={"d_ff": 8})
    experts = config.replace(feed_forward={"type": "MoESettings", "num_experts": 4, "d_ff": 8})
    assert experts.layers.block.feed_forward == MoESettings(num_experts=4, d_ff=8)


@pytest.mark.parametrize("name", zoo.presets.names())
def test_every_preset_round_trips_through_json(name):
    config = zoo.presets.get(name).config
    data = json.loads(config.to_json())
    assert type(config).from_dict(data) == config


def _resolved(config):
    """A config's JSON form with each plan as its layers' settings (how its overrides say it
    does not matter, what each layer is does)."""
    data = to_data(config)
    for plan in config.plans:
        data[plan] = [to_data(settings) for settings in getattr(config, plan).layers()]
    return data


# the published decoder sizes of these families now recompute elementwise work on a CPU only
# (`remat="auto"`, as the Llama family's always did); 0.1 left them at None
AUTO_REMAT_SINCE_0_2 = {
    "gemma-2-2b", "gemma-3-1b", "gemma-3-270m", "mixtral-8x7b", "olmo-2-1b", "olmoe-1b-7b",
    "phi-3-mini-4k", "phi-3.5-mini", "phi-4-mini", "qwen2-moe-a2.7b", "qwen3-30b-a3b",
}  # fmt: skip
NEW_SINCE_0_1 = {"smollm3-tiny", "smollm3-3b", "olmo3-tiny", "olmo3-7b"}


def test_every_0_1_preset_reads_as_todays_preset():
    """`tests/fixtures/presets_0.1.json` holds each preset as 0.1 wrote it (its fields that
    differ from 0.1's defaults): upgraded, each is today's preset, layer by layer."""
    old = json.loads((FIXTURES / "presets_0.1.json").read_text())
    assert sorted(old) == sorted(set(zoo.presets.names()) - NEW_SINCE_0_1)
    for name, entry in old.items():
        cls = FLAVORS[entry["flavor"]][0]
        upgraded = cls.from_dict(entry["config"])
        today = zoo.presets.get(name).config
        if name in AUTO_REMAT_SINCE_0_2:
            assert (upgraded.remat, today.remat) == (None, "auto"), name
            upgraded = upgraded.replace(remat="auto")
        assert _resolved(upgraded) == _resolved(today), name


def test_configs_saved_with_scan_layers_and_flat_rope_fields_still_read():
    """Older still: `scan_layers` true (the old default) reads as "auto" and false as
    "unroll"; flat `rope_*` fields read as one `Rope`."""
    assert GPTConfig.from_dict({"scan_layers": True}).layer_loop == "auto"
    assert GPTConfig.from_dict({"scan_layers": False}).layer_loop == "unroll"
    old = GPTConfig.from_dict({"positions": "rotary", "rope_theta": 500.0, "rope_factor": 2.0})
    rope = old.layers.block.attention.rope
    assert rope is not None and (rope.theta, rope.factor) == (500.0, 2.0)
    assert old.embedder.positions == "none"
    with pytest.raises(ValueError, match=r"unknown GPTConfig field\(s\) \['colour'\]"):
        GPTConfig.from_dict({"colour": "blue"})


def test_configs_are_frozen_keyword_only_and_round_trip():
    config = GPTConfig().replace(d_model=64, num_heads=4)
    with pytest.raises(AttributeError):
        config.d_model = 32  # type: ignore[misc]
    with pytest.raises(TypeError):
        GPTConfig(64)  # type: ignore[misc]
    assert GPTConfig.from_dict(config.to_dict()) == config
    assert config.head_dim == 16


def test_translator_derived_sizes():
    config = TranslatorConfig(vocab_size=100, target_vocab_size=80, share_embeddings=False)
    config = config.replace(**{"decoder.num_layers": 3})
    assert config.tgt_vocab == 80 and config.decoder_layers == 3 and config.num_layers == 6
    assert TranslatorConfig().tgt_vocab == 37000


def test_unscaled_scores_reach_every_attention():
    model = zoo.create("translator-tiny", key=jax.random.key(0), **{"attention.scale_dim": 1.0})
    attentions = [model.encoder.blocks.self_attention, model.decoder.blocks.self_attention]
    assert [a.scale_scores for a in attentions] == [1.0, 1.0]
    # a short path changes every plan's base block; the cross-attention is its own record
    assert model.decoder.blocks.cross_attention.scale_scores is True


def test_layer_loop_choices():
    config = GPTConfig()
    assert config.layer_loop == "auto" and config.scan_layers is None
    assert GPTConfig(layer_loop="scan").scan_layers is True
    assert GPTConfig(layer_loop="unroll").scan_layers is False
    with pytest.raises(ValueError, match="layer_loop must be one of"):
        GPTConfig(layer_loop="loop")


@pytest.mark.parametrize(
    ("cls", "changes", "message"),
    [
        (
            GPTConfig,
            {"attention.rope": Rope()},
            r"layers\[0\].attention.rope rotates queries and keys, but the embedder adds "
            "learned positions too",
        ),
        (GPTConfig, {"embedder.type_vocab_size": 2}, "GPTConfig: embedder.type_vocab_size adds"),
        (
            GPTConfig,
            {"cross_attention": AttentionSettings(num_heads=12)},
            r"GPTConfig: layers\[0\].cross_attention is a translator decoder's",
        ),
        (
            TranslatorConfig,
            {"attention.window": 4},
            r"TranslatorConfig: layers\[0\].attention.window is not used",
        ),
        (
            TranslatorConfig,
            {"decoder.block.cross_attention": None},
            r"decoder\[0\].cross_attention is None: a decoder layer attends to the source",
        ),
        (
            ClassifierConfig,
            {"cross_attention": AttentionSettings(num_heads=12)},
            r"ClassifierConfig: layers\[0\].cross_attention",
        ),
    ],
)
def test_a_flavor_refuses_what_it_does_not_use(cls, changes, message):
    with pytest.raises(ValueError, match=message):
        cls().replace(**changes)


def test_an_override_outside_the_layers_is_refused_with_the_layers():
    plan = LayerPlan(
        block=BlockSettings(),
        num_layers=4,
        overrides=(LayerOverride(changes={"attention_norm": False}, layers=(3,)),),
    )
    with pytest.raises(ValueError, match=r"names layers \[3\], which a 2-layer stack"):
        dataclasses.replace(plan, num_layers=2)
    with pytest.raises(ValueError, match="AttentionSettings has no field 'windows'"):
        LayerOverride(changes={"attention.windows": 2})
    with pytest.raises(ValueError, match="attention_norm=False is for pre-norm blocks"):
        LayerPlan(
            block=BlockSettings(norm_first=False),
            overrides=(LayerOverride(changes={"attention_norm": False}, layers=(0,)),),
        )


def test_the_norm_record_is_the_blocks_and_the_final_norms():
    config = zoo.presets.get("olmo-2-tiny").config
    assert config.layers.block.norm == NormSettings(kind="rmsnorm", eps=1e-5)
    model = zoo.create("olmo-2-tiny", key=jax.random.key(0))
    assert model.final_norm is not None and model.final_norm.eps == 1e-5


def test_a_setting_of_0_1_reads_as_its_one_field():
    """What `zoo train --resume` makes of a run's command written under 0.1."""
    from zoo.models.flat import renamed_setting

    assert renamed_setting("num_kv_heads=1") == "attention.num_kv_heads=1"
    assert renamed_setting("tie_embeddings=false") == "head.tie=false"
    assert renamed_setting("num_layers=2") == "num_layers=2"  # an alias of today
    assert renamed_setting("global_layers=[0]") == "global_layers=[0]"  # no one field: refused
    config = zoo.presets.config("llama-tiny", **{"attention.num_kv_heads": 1})
    assert config.kv_heads == 1
