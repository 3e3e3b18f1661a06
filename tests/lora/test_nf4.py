"""An NF4 frozen base (`zoo.lora.quantize(model, "nf4")`, QLoRA): the NF4 and dynamic 8-bit
levels, the blockwise double quantization against a numpy reference and bitsandbytes, bytes,
and adapters training on top."""

from __future__ import annotations

import statistics

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.lora.helpers import forward
from zoo.nn.linear import Linear
from zoo.nn.nf4 import NF4_LEVELS, NF4Linear, dynamic_levels, quantize_nf4
from zoo.train.step import make_train_step
from zoo.tree import named_arrays


def test_the_nf4_levels_are_qloras_normal_quantiles():
    """QLoRA's construction (`create_normal_map(offset=0.9677083)`): 8 positive and 7 negative
    quantiles of N(0, 1) between `offset` and 1/2, and 0, scaled to [-1, 1]."""
    normal = statistics.NormalDist()
    offset = 0.9677083
    positive = [normal.inv_cdf(p) for p in np.linspace(offset, 0.5, 9)[:-1]]
    negative = [-normal.inv_cdf(p) for p in np.linspace(offset, 0.5, 8)[:-1]]
    levels = np.sort(np.array([*positive, 0.0, *negative]))
    levels = levels / np.abs(levels).max()
    np.testing.assert_allclose(NF4_LEVELS, levels, atol=1e-7)
    dynamic = dynamic_levels()
    assert dynamic.shape == (256,) and dynamic[-1] == 1.0 and np.all(np.diff(dynamic) >= 0)
    assert np.count_nonzero(dynamic == 0) == 1 and dynamic.min() == pytest.approx(-0.99296875)


def reference_nf4(weight):
    """The algorithm written out plainly: blocks of 64 over the flat weight, each value the
    nearest NF4 level of value / absmax; absmaxes less their mean, in blocks of 256, each the
    nearest dynamic level of value / block absmax. Returns the dequantized weight."""
    flat = weight.reshape(-1).astype(np.float32)
    flat = np.concatenate([flat, np.zeros(-flat.size % 64, np.float32)])
    blocks = flat.reshape(-1, 64)
    absmax = np.abs(blocks).max(axis=1)
    nearest = np.abs((blocks / absmax[:, None])[..., None] - NF4_LEVELS).argmin(axis=-1)
    offset = absmax.mean(dtype=np.float32)
    centred = absmax - offset
    levels = dynamic_levels()
    restored = np.empty_like(absmax)
    for start in range(0, absmax.size, 256):
        part = centred[start : start + 256]
        top = np.abs(part).max()
        index = np.abs((part / top)[:, None] - levels).argmin(axis=1)
        restored[start : start + 256] = levels[index] * top + offset
    values = NF4_LEVELS[nearest] * restored[:, None]
    return values.reshape(-1)[: weight.size].reshape(weight.shape)


def nf4_layer(weight):
    linear = Linear(weight.shape[1], weight.shape[0], use_bias=False, key=jax.random.key(0))
    return NF4Linear.from_linear(eqx.tree_at(lambda layer: layer.weight, linear,
                                             jnp.asarray(weight)))  # fmt: skip


WEIGHTS = [(64, 128), (96, 200), (33, 7)]  # whole blocks, 300 blocks (two scale blocks), a tail


@pytest.mark.parametrize("shape", WEIGHTS)
def test_nf4_equals_a_numpy_reference(shape):
    weight = (np.random.default_rng(sum(shape)).standard_normal(shape) * 0.05).astype(np.float32)
    ours = np.asarray(nf4_layer(weight).dequantized())
    np.testing.assert_array_equal(ours, reference_nf4(weight))
    assert 0 < np.abs(ours - weight).max() < 0.2 * np.abs(weight).max()


def test_nf4_equals_bitsandbytes():
    """bitsandbytes (`quantize_4bit(nf4, blocksize=64, compress_statistics=True)`) on this CPU:
    the same 4-bit codes, and its dequantization of zoo's codes is zoo's, bit for bit. Its CPU
    8-bit search for the scales' levels picks the farther of two levels for a few absmaxes
    within ~1e-3 of the midpoint between them; those blocks differ by one 8-bit level."""
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("bitsandbytes.functional")
    assert np.array_equal(functional.get_4bit_type("nf4", device="cpu").numpy(), NF4_LEVELS)
    for shape in WEIGHTS:
        weight = (np.random.default_rng(sum(shape)).standard_normal(shape) * 0.05).astype(
            np.float32
        )
        packed, state = functional.quantize_4bit(torch.from_numpy(weight), blocksize=64,
                                                 compress_statistics=True, quant_type="nf4")  # fmt: skip
        parts = quantize_nf4(weight)
        np.testing.assert_array_equal(parts["codes"][: packed.numel()], packed.numpy().reshape(-1))
        apart = parts["scale_codes"].astype(int) - state.absmax.numpy().astype(int)
        assert np.abs(apart).max() <= 1 and np.count_nonzero(apart) <= 0.01 * apart.size + 1
        assert np.array_equal(functional.create_dynamic_map().numpy()[1:], dynamic_levels()[1:])
        ours = np.asarray(nf4_layer(weight).dequantized())
        state.absmax = torch.from_numpy(parts["scale_codes"])
        state.offset = torch.tensor(parts["scale_offset"])
        state.state2.absmax = torch.from_numpy(parts["scale_absmax"])
        state.state2.code = torch.from_numpy(dynamic_levels())
        theirs = functional.dequantize_4bit(packed, state).numpy()
        np.testing.assert_array_equal(ours, theirs)


def test_nf4_costs_about_half_a_byte_per_weight(key):
    model = zoo.create("gpt-tiny", key=key)
    quantized = zoo.lora.quantize(model, "nf4")
    before, after = named_arrays(model), named_arrays(quantized)
    for path in zoo.lora.quantized_paths(quantized):
        *layers, rows, columns = before[f"{path}.weight"].shape  # stacked: one code set a layer
        blocks = -(-rows * columns // 64)
        stored = sum(after[f"{path}.{name}"].nbytes for name in
                     ("codes", "scale_codes", "scale_absmax", "scale_offset"))  # fmt: skip
        assert stored == np.prod(layers) * (blocks * 32 + blocks + 4 * -(-blocks // 256) + 4)
        assert stored < 0.53 * before[f"{path}.weight"].size
    reference, logits = np.asarray(forward(model)), np.asarray(forward(quantized))
    assert np.abs(logits - reference).max() < 0.15 * np.abs(reference).max()


def test_qlora_trains_the_adapters_on_an_nf4_base_and_saves(key, tmp_path):
    model = zoo.create("gpt-tiny", key=key)
    adapted = zoo.lora.quantize(zoo.lora.apply(model, rank=4, targets="attention", key=key), "nf4")
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2))
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(eqx.filter(adapted, eqx.is_inexact_array))
    before = {name: np.asarray(a) for name, a in named_arrays(adapted).items()}
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer)
    tokens = jnp.array([[1, 5, 9, 4, 7, 3], [1, 7, 7, 3, 8, 2]], jnp.int32)
    trained, state, first = step(adapted, state, {"tokens": tokens}, key, 0)
    for index in range(1, 4):
        trained, state, out = step(trained, state, {"tokens": tokens}, key, index)
    assert float(out.stats.loss_sum) < float(first.stats.loss_sum)
    after = named_arrays(trained)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed == {name for name in before if name.endswith((".lora_a", ".lora_b"))}
    zoo.save(trained, tmp_path)
    loaded = zoo.load(tmp_path)
    assert isinstance(zoo.lora.lora_layers(loaded)["layers.blocks.self_attention.query_proj"].base,
                      NF4Linear)  # fmt: skip
    np.testing.assert_array_equal(forward(loaded), forward(trained))
    merged = zoo.lora.merge(trained)
    assert zoo.lora.quantized_paths(merged) == []
    np.testing.assert_allclose(forward(merged), forward(trained), atol=1e-5)
