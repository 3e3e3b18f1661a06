"""The `phi-3.5-mini` and `phi-4-mini` presets against the hub's own config.json.

`tests/fixtures/hub_configs/` holds microsoft/Phi-3.5-mini-instruct's and
microsoft/Phi-4-mini-instruct's config.json as published. The presets carry their LongRoPE
factor lists: exported, they say what the hub's config says; the hub's config loads to the
preset's rope; and the frequencies zoo rotates by equal transformers' for that config, on
either side of the original 4096 positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.interop.architecture import HFConfig
from zoo.interop.architectures.phi3 import PHI3

pytestmark = pytest.mark.hf
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

HUB_CONFIGS = Path(__file__).parents[1] / "fixtures" / "hub_configs"
PRESETS = {"phi-3.5-mini": "Phi-3.5-mini-instruct", "phi-4-mini": "Phi-4-mini-instruct"}
# fields of the hub config the export must repeat
SAME_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def hub_config(name: str) -> dict:
    return json.loads((HUB_CONFIGS / f"{PRESETS[name]}.json").read_text())


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_export_says_what_the_hub_config_says(name):
    hub, exported = hub_config(name), PHI3.hf_config(zoo.presets.config(name))
    assert {k: exported[k] for k in SAME_FIELDS} == {k: hub[k] for k in SAME_FIELDS}
    assert exported["partial_rotary_factor"] == hub.get("partial_rotary_factor", 1.0)
    ours, theirs = exported["rope_scaling"], hub["rope_scaling"]
    assert (ours["rope_type"], theirs["type"]) == ("longrope", "longrope")
    assert ours["short_factor"] == theirs["short_factor"]
    assert ours["long_factor"] == theirs["long_factor"]
    assert len(ours["long_factor"]) == 48
    # the hub leaves the factor to transformers: max_position_embeddings / original
    assert (
        ours["factor"] == hub["max_position_embeddings"] / hub["original_max_position_embeddings"]
    )


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_hub_config_loads_to_the_presets_rope(name):
    fields = PHI3.zoo_fields(HFConfig(hub_config(name), PHI3.hf_defaults(), "phi3"), {})
    config = zoo.presets.config(name)
    assert fields["attention.rope"] == config.layers.block.attention.rope
    assert fields["max_positions"] == config.max_positions == 131072


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("length", [4096, 4097])
def test_the_frequencies_equal_transformers_for_the_hub_config(name, length):
    """One head of the preset's width (96 and 128, 48 rotating pairs each), the hub's rope:
    within 4096 positions the short factors, past them the long ones, and the same cos/sin
    scale (sqrt(1 + ln 32 / ln 4096))."""
    config = zoo.presets.config(name)
    hub = dict(hub_config(name), hidden_size=config.head_dim, num_attention_heads=1)
    hub.update(num_key_value_heads=1, intermediate_size=8, num_hidden_layers=1, vocab_size=8)
    hf_config = transformers.Phi3Config(**{k: v for k, v in hub.items() if k != "model_type"})
    longrope = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["longrope"]
    theirs, attention_factor = longrope(hf_config, None, seq_len=length)
    rope = config.layers.block.attention.rope
    ours = rope.frequencies_at(config.head_dim, jnp.arange(length))
    # float32 powers: numpy's and torch's differ in the last bit at most
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=3e-7, atol=0)
    assert rope.table_scale == pytest.approx(attention_factor, rel=1e-12)
    assert attention_factor == pytest.approx(np.sqrt(1 + np.log(32) / np.log(4096)))
