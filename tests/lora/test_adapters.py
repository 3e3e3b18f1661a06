"""LoRA as tree operations: apply, merge, unmerge, target groups, stacked layers, errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.lora.helpers import forward, randomize_adapters
from zoo.nn import QKNorm

FLAVORS = {
    "gpt-tiny": {},
    "classifier-tiny": {},
    "translator-tiny": {},
    # Llama-style: rotary, RMSNorm, SwiGLU, grouped-query heads; QK-norm as in Qwen3
    "llama-tiny": {"attention.qk_norm": QKNorm()},
}


@pytest.mark.parametrize(
    "preset",
    [
        "gpt-tiny",
        "llama-tiny",
        # the other flavors run the same code path; kept out of the quick tier
        pytest.param("classifier-tiny", marks=pytest.mark.slow),
        pytest.param("translator-tiny", marks=pytest.mark.slow),
    ],
)
def test_untrained_adapters_change_nothing_and_merge_matches(preset, key):
    model = zoo.create(preset, key=key, **FLAVORS[preset])
    adapted = zoo.lora.apply(model, rank=4, alpha=8, targets="all-linear", key=key)
    # B = 0: exactly the base model's logits
    np.testing.assert_array_equal(forward(adapted), forward(model))
    trained = randomize_adapters(adapted)
    logits = forward(trained)
    assert float(jnp.max(jnp.abs(logits - forward(model)))) > 1e-3  # the adapters do something
    merged = zoo.lora.merge(trained)
    assert not zoo.lora.has_lora(merged)
    np.testing.assert_allclose(forward(merged), logits, atol=1e-5, rtol=1e-5)
    restored = zoo.lora.unmerge(merged, trained)
    np.testing.assert_allclose(forward(restored), logits, atol=1e-5, rtol=1e-5)
    for path, layer in zoo.lora.lora_layers(restored).items():
        original = zoo.lora.lora_layers(trained)[path].base.weight
        np.testing.assert_allclose(layer.base.weight, original, atol=1e-6)


def test_stacked_layers_get_stacked_adapters(key):
    model = zoo.create("llama-tiny", key=key)  # 2 layers, 4 query heads, 2 kv heads, d_model 64
    adapted = zoo.lora.apply(model, rank=3, alpha=6, targets="attention.qkv,feedforward", key=key)
    layers = zoo.lora.lora_layers(adapted)
    assert sorted(layers) == [
        f"layers.blocks.{name}"
        for name in (
            "feed_forward.gate",
            "feed_forward.hidden",
            "feed_forward.output",
            "self_attention.key_proj",
            "self_attention.query_proj",
            "self_attention.value_proj",
        )
    ]
    key_proj = layers["layers.blocks.self_attention.key_proj"]
    # GQA: keys are 2 heads * 16 = 32 wide; the stack's layer axis leads
    assert key_proj.lora_a.shape == (2, 3, 64)
    assert key_proj.lora_b.shape == (2, 32, 3)
    assert key_proj.scale == 2.0
    assert layers["layers.blocks.feed_forward.output"].lora_a.shape == (2, 3, 128)
    # the first layer's A rows are independent draws in +-1/sqrt(64)
    a = np.asarray(key_proj.lora_a)
    assert np.abs(a).max() <= 1 / 8 and not np.allclose(a[0], a[1])


def test_groups_and_patterns(key):
    model = zoo.create("translator-tiny", key=key)
    qv = zoo.lora.lora_layers(zoo.lora.apply(model, targets="attention.qv", key=key))
    assert sorted(qv) == [
        "decoder.blocks.cross_attention.query_proj",
        "decoder.blocks.cross_attention.value_proj",
        "decoder.blocks.self_attention.query_proj",
        "decoder.blocks.self_attention.value_proj",
        "encoder.blocks.self_attention.query_proj",
        "encoder.blocks.self_attention.value_proj",
    ]
    one = zoo.lora.apply(model, targets=["decoder.blocks.cross_attention.*"], key=key)
    assert len(zoo.lora.lora_layers(one)) == 4
    every = zoo.lora.lora_layers(zoo.lora.apply(model, rank=2, targets="all-linear", key=key))
    assert "output_proj" not in every  # the vocabulary projection is left out, as in PEFT
    assert len(every) == 4 + 4 + 4 + 2 + 2  # enc attention, dec self, dec cross, two dense FFNs


def test_bad_input_says_what_to_do(key):
    model = zoo.create("gpt-tiny", key=key)
    with pytest.raises(
        ValueError, match=r"'attn' matches no Linear .* layers\.blocks\.self_attention\.query_proj"
    ):
        zoo.lora.apply(model, targets="attn", key=key)
    with pytest.raises(ValueError, match="rank must be a positive integer, got 0"):
        zoo.lora.apply(model, rank=0, key=key)
    width = model.config.d_model
    with pytest.raises(ValueError, match=f"rank {width + 1} exceeds the width of layers.blocks"):
        zoo.lora.apply(model, rank=width + 1, key=key)
    with pytest.raises(ValueError, match=r"dropout must be a share of the inputs in \[0, 1\)"):
        zoo.lora.apply(model, dropout=1.5, key=key)
    adapted = zoo.lora.apply(model, key=key)
    with pytest.raises(ValueError, match="already has LoRA adapters; merge them first"):
        zoo.lora.apply(adapted, key=key)
    with pytest.raises(ValueError, match="no LoRA adapters to merge"):
        zoo.lora.merge(model)
