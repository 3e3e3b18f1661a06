"""`LoRALinear` by hand, and where a model holds its adapters (`describe` and `rebuild`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.nn import Linear, LoRALinear, QuantizedLinear
from zoo.nn.lora import describe, has_lora, linear_paths, lora_layers, rebuild


def test_lora_linear_adds_the_scaled_low_rank_update(key):
    base = Linear(3, 2, key=key)
    lora_a = jnp.array([[1.0, 0.0, 2.0]])  # rank 1: [rank, in]
    lora_b = jnp.array([[0.5], [-1.0]])  # [out, rank]
    layer = LoRALinear(base, lora_a, lora_b, alpha=4)
    assert (layer.rank, layer.scale, layer.in_features, layer.out_features) == (1, 4.0, 3, 2)
    x = jnp.array([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]])
    # x A^T = [3, 0]; times B^T -> [[1.5, -3], [0, 0]]; times alpha / rank = 4
    expected = base(x) + jnp.array([[6.0, -12.0], [0.0, 0.0]])
    np.testing.assert_allclose(layer(x), expected, rtol=1e-6)
    np.testing.assert_allclose(layer.delta(), 4.0 * lora_b @ lora_a, rtol=1e-6)


def test_a_fresh_adapter_changes_nothing_and_keeps_stacked_axes(key):
    base = Linear(8, 4, key=key)
    layer = LoRALinear.wrap(base, rank=2, alpha=4, key=key)
    assert layer.lora_a.shape == (2, 8) and layer.lora_b.shape == (4, 2)
    assert np.abs(np.asarray(layer.lora_a)).max() <= 1 / np.sqrt(8)  # PEFT's range
    x = jax.random.normal(key, (5, 8))
    np.testing.assert_array_equal(layer(x), base(x))  # B = 0
    stacked = jax.vmap(lambda k: Linear(8, 4, key=k))(jax.random.split(key, 3))
    wrapped = LoRALinear.wrap(stacked, rank=2, alpha=4, key=key)
    assert wrapped.lora_a.shape == (3, 2, 8) and wrapped.lora_b.shape == (3, 4, 2)
    quantized = LoRALinear.wrap(QuantizedLinear.from_linear(base), rank=2, alpha=4, key=key)
    assert quantized.lora_a.dtype == jnp.float32  # the scales' dtype, not int8


def test_describe_and_rebuild_restore_the_adapter_layout(key):
    model = zoo.create("gpt-tiny", key=key)
    assert not has_lora(model)
    adapted = zoo.lora.apply(model, rank=3, alpha=6, targets="attention.qv", key=key)
    layout = describe(adapted)
    assert layout == {
        "layers.blocks.self_attention.query_proj": {"rank": 3, "alpha": 6.0},
        "layers.blocks.self_attention.value_proj": {"rank": 3, "alpha": 6.0},
    }
    again = rebuild(model, layout)
    assert describe(again) == layout
    for path, layer in lora_layers(again).items():
        assert layer.lora_a.shape == lora_layers(adapted)[path].lora_a.shape
        assert not np.any(np.asarray(layer.lora_a))  # placeholders, filled from a file
    with pytest.raises(ValueError, match=r"sit on Linear layers this model lacks: \['nowhere'\]"):
        rebuild(model, {"nowhere": {"rank": 1, "alpha": 1.0}})
    assert "layers.blocks.self_attention.query_proj" in linear_paths(model)
