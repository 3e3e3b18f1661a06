"""An int8 frozen base (`zoo.lora.quantize`): accuracy, bytes, adapters-only training, save/load."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.lora.helpers import forward, randomize_adapters
from zoo.train.checkpoint import state_arrays
from zoo.train.step import make_train_step
from zoo.tree import named_arrays


@pytest.mark.parametrize("preset", ["gpt-tiny", "classifier-tiny"])
def test_int8_base_is_close_to_float_and_a_quarter_of_the_bytes(key, preset):
    model = zoo.create(preset, key=key)
    quantized = zoo.lora.quantize(model, "int8")
    paths = zoo.lora.quantized_paths(quantized)
    assert len(paths) == 6  # q, k, v, o and the two feed-forward layers of the stacked blocks
    assert not any(path.startswith("head") for path in paths)  # an output layer stays float
    reference, logits = np.asarray(forward(model)), np.asarray(forward(quantized))
    # measured: 0.8% (gpt-tiny) and 0.3% (classifier-tiny) of the largest logit
    assert np.abs(logits - reference).max() < 0.01 * np.abs(reference).max()
    before, after = named_arrays(model), named_arrays(quantized)
    for path in paths:
        weight, int8 = before[f"{path}.weight"], after[f"{path}.weight"]
        assert int8.nbytes * 4 == weight.nbytes
        assert after[f"{path}.scale"].nbytes * weight.shape[-1] == weight.nbytes  # 1 per row
    # adapters on the int8 base start at zero change; merge folds them into float weights
    adapted = zoo.lora.apply(quantized, rank=2, alpha=4, targets="attention", key=key)
    np.testing.assert_array_equal(forward(adapted), logits)
    adapted = randomize_adapters(adapted)
    merged = zoo.lora.merge(adapted)
    assert zoo.lora.quantized_paths(merged) == []  # every layer dequantized: a float model
    np.testing.assert_allclose(forward(merged), forward(adapted), atol=1e-5)


@pytest.mark.slow
def test_only_adapters_train_on_an_int8_base_and_it_saves(key, tmp_path):
    model = zoo.create("gpt-tiny", key=key)
    adapted = zoo.lora.quantize(zoo.lora.apply(model, rank=4, targets="attention", key=key))
    # a separate int8 base for the adapter to go back onto (the step may donate shared buffers)
    base = zoo.lora.quantize(
        jax.tree_util.tree_map(lambda x: x.copy() if eqx.is_array(x) else x, model)
    )
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2))
    params = eqx.filter(adapted, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(params)
    before = {name: np.asarray(a) for name, a in named_arrays(adapted).items()}
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer, precision="bf16")
    tokens = jnp.array([[1, 5, 9, 4, 7, 3], [1, 7, 7, 3, 8, 2]], jnp.int32)
    trained, state, _ = step(adapted, state, {"tokens": tokens}, key, 0)
    trained, state, out = step(trained, state, {"tokens": tokens}, key, 1)  # A moves once B != 0
    assert np.isfinite(float(out.stats.loss_sum))
    after = named_arrays(trained)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    adapters = {name for name in before if name.endswith((".lora_a", ".lora_b"))}
    assert changed == adapters  # int8 weights and their scales bit-for-bit unchanged
    assert after["layers.blocks.self_attention.query_proj.base.weight"].dtype == jnp.int8
    moments = sum(a.nbytes for name, a in state_arrays(state).items() if "count" not in name)
    assert moments == 2 * sum(before[name].nbytes for name in adapters)
    zoo.save(trained, tmp_path / "run")
    loaded = zoo.load(tmp_path / "run")
    assert zoo.lora.quantized_paths(loaded) == zoo.lora.quantized_paths(trained)
    np.testing.assert_array_equal(forward(loaded), forward(trained))
    # the PEFT adapter goes back onto the int8 base: the same logits
    zoo.lora.save_adapter(trained, tmp_path / "adapter")
    again = zoo.lora.load_adapter(base, tmp_path / "adapter")
    assert zoo.lora.lora_layers(again)["layers.blocks.self_attention.query_proj"].lora_a.dtype == (
        jnp.float32
    )
    np.testing.assert_allclose(forward(again), forward(trained), atol=1e-6)


def test_bad_quantization_requests(key):
    model = zoo.create("gpt-tiny", key=key)
    with pytest.raises(ValueError, match="unknown quantization 'fp4'; .* 'int8' .* or 'nf4'"):
        zoo.lora.quantize(model, "fp4")
    with pytest.raises(ValueError, match="nothing to quantize: every Linear layer is under skip"):
        zoo.lora.quantize(model, skip=("layers",))
