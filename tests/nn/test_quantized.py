"""`QuantizedLinear`: an int8 weight with one scale per output row, and where a model holds them."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

import zoo
from zoo.nn import Linear, QuantizedLinear
from zoo.nn.quantized import dequantize, quantize_at, quantized_paths


def test_int8_layer_rounds_each_row_to_its_own_scale(key):
    linear = Linear(4, 2, key=key)
    weight = jnp.array([[0.5, -1.27, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0]])
    linear = eqx.tree_at(lambda layer: layer.weight, linear, weight)
    layer = QuantizedLinear.from_linear(linear)
    assert layer.weight.dtype == jnp.int8 and layer.scale.dtype == jnp.float32
    # row 0: scale = 1.27 / 127 = 0.01 -> 50, -127, 30, 0; an all-zero row keeps scale 1
    np.testing.assert_array_equal(layer.weight, [[50, -127, 30, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(layer.scale, [0.01, 1.0], rtol=1e-6)
    x = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_allclose(layer(x), x @ layer.dequantize().weight.T, rtol=1e-6)
    np.testing.assert_allclose(layer(x), [[0.5 - 2.54 + 0.9, 0.0]], rtol=1e-5)


def test_quantize_at_chosen_paths_records_them_and_dequantize_undoes_it(key):
    model = zoo.create("gpt-tiny", key=key)
    path = "layers.blocks.self_attention.query_proj"
    quantized = quantize_at(model, [path])
    assert quantized_paths(quantized) == [path]
    layer = quantized.layers.blocks.self_attention.query_proj
    assert isinstance(layer, QuantizedLinear) and layer.weight.dtype == jnp.int8
    assert layer.weight.shape == model.layers.blocks.self_attention.query_proj.weight.shape
    back = dequantize(quantized)
    assert quantized_paths(back) == []
    # q * scale is within half a step (scale / 2) of each original weight
    original = model.layers.blocks.self_attention.query_proj.weight
    restored = back.layers.blocks.self_attention.query_proj.weight
    assert restored.dtype == original.dtype
    half_step = np.asarray(layer.scale)[..., None] / 2
    assert np.all(np.abs(np.asarray(restored) - np.asarray(original)) <= half_step + 1e-7)
    # the layers not named stay as they were
    np.testing.assert_array_equal(
        back.layers.blocks.self_attention.key_proj.weight,
        model.layers.blocks.self_attention.key_proj.weight,
    )
