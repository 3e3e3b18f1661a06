"""LoRA and int8 on a mixture's stacked experts: the adapters run through the grouped matmul,
start as the base, train alone, merge exactly, save and load (zoo and PEFT), and an int8 base
stays within its quantization step."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zoo
from zoo.cli import main
from zoo.lora.adapters import only_adapters
from zoo.nn.lora import LoRAExperts, lora_experts
from zoo.nn.moe import MoEFeedForward, MoESettings
from zoo.nn.quantized import QuantizedExperts

TOKENS = jnp.array([[5, 9, 13, 7, 22, 40, 3, 11], [1, 30, 31, 32, 17, 4, 9, 2]], jnp.int32)
EXPERTS = ("gate", "up", "down")


def randomize(model, std=0.3):
    """Every expert adapter's B random (fresh ones are zero and change nothing)."""

    def fill(node):
        if not isinstance(node, LoRAExperts):
            return node
        noise = std * jax.random.normal(jax.random.key(node.lora_b.size), node.lora_b.shape)
        return LoRAExperts(node.base, node.lora_a, noise, alpha=node.alpha)

    return jax.tree_util.tree_map(fill, model, is_leaf=lambda n: isinstance(n, LoRAExperts))


@eqx.filter_jit
def logits(model, tokens=TOKENS):
    return jax.vmap(model)(tokens)


@pytest.fixture(scope="module")
def model():
    return zoo.create("mixtral-tiny", key=jax.random.key(0), remat=None)


@pytest.fixture(scope="module")
def adapted(model):
    return zoo.lora.apply(model, rank=4, alpha=8, targets="experts", key=jax.random.key(1))


def test_expert_adapters_are_stacked_per_expert_and_start_as_the_base(model, adapted):
    layers = lora_experts(adapted)
    assert sorted(layers) == [f"layers.blocks.feed_forward.experts.{n}" for n in sorted(EXPERTS)]
    gate = layers["layers.blocks.feed_forward.experts.gate"]
    assert gate.lora_a.shape == (2, 4, 64, 4) and gate.lora_b.shape == (2, 4, 4, 64)
    assert type(adapted.layers.blocks.feed_forward.router).__name__ == "Linear"  # frozen, unwrapped
    np.testing.assert_array_equal(logits(adapted), logits(model))


def test_grouped_adapters_equal_a_per_row_numpy_reference():
    """Rows sorted by expert: row r of expert e gets `x (W_e + s A_e B_e)`; int8 base too."""
    keys = jax.random.split(jax.random.key(2), 4)
    weight = jax.random.normal(keys[0], (3, 8, 5))
    rows = jax.random.normal(keys[1], (7, 8))
    sizes = jnp.array([2, 0, 5], jnp.int32)
    for base in (weight, QuantizedExperts.from_float(weight)):
        layer = LoRAExperts.wrap(base, rank=2, alpha=3, key=keys[2])
        layer = LoRAExperts(base, layer.lora_a, jax.random.normal(keys[3], (3, 2, 5)), alpha=3)
        dense = np.asarray(base if base is weight else base.dequantize())
        a, b = np.asarray(layer.lora_a), np.asarray(layer.lora_b)
        expert = np.repeat(np.arange(3), np.asarray(sizes))
        expected = np.stack(
            [x @ (dense[e] + 1.5 * a[e] @ b[e]) for x, e in zip(np.asarray(rows), expert)]
        )
        grouped = eqx.filter_jit(lambda m, x, s: m.grouped(x, s))(layer, rows, sizes)
        np.testing.assert_allclose(grouped, expected, rtol=1e-5, atol=1e-5)
        every = np.asarray(eqx.filter_jit(lambda m, x: m.every(x))(layer, rows))
        np.testing.assert_allclose(every[expert, np.arange(7)], expected, rtol=1e-5, atol=1e-5)


def test_only_the_adapters_get_gradients_and_updates(adapted):
    trained = randomize(adapted)

    def loss(m):
        return jnp.mean(logits(m) ** 2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(trained)
    for name in EXPERTS:
        projection = getattr(grads.layers.blocks.feed_forward.experts, name)
        assert not np.any(np.asarray(projection.base))  # the frozen base: exactly 0
        assert np.abs(np.asarray(projection.lora_a)).max() > 0
    optimizer = only_adapters(optax.sgd(1.0))
    params = eqx.filter(trained, eqx.is_inexact_array)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    assert np.abs(np.asarray(grads.layers.blocks.feed_forward.router.weight)).max() > 0
    assert not np.any(np.asarray(updates.layers.blocks.feed_forward.router.weight))  # frozen
    assert np.abs(np.asarray(updates.layers.blocks.feed_forward.experts.up.lora_b)).max() > 0


def test_merge_equals_the_adapted_forward_and_unmerge_restores(model, adapted):
    trained = randomize(adapted)
    ours = logits(trained)
    assert np.abs(np.asarray(ours - logits(model))).max() > 1e-2  # the adapters do something
    merged = zoo.lora.merge(trained)
    assert not zoo.lora.has_lora(merged)
    np.testing.assert_allclose(logits(merged), ours, atol=1e-5)
    back = zoo.lora.unmerge(merged, trained)
    np.testing.assert_allclose(
        back.layers.blocks.feed_forward.experts.down.base,
        model.layers.blocks.feed_forward.experts.down,
        atol=1e-5,
    )


def _adapted_layer(implementation: str) -> MoEFeedForward:
    """A tiny mixture with int8 experts, adapters on `up` and `down` (random B)."""
    settings = MoESettings(num_experts=4, top_k=2, d_ff=8, implementation=implementation)
    layer = MoEFeedForward(16, settings, key=jax.random.key(3))
    layer = zoo.lora.apply(layer, rank=2, targets="experts.up,experts.down", key=jax.random.key(4))
    return zoo.lora.quantize(randomize(layer))


def test_ragged_equals_dense_and_vmap_equals_a_loop():
    layer, dense = _adapted_layer("ragged"), _adapted_layer("dense")
    assert isinstance(layer.experts.up.base, QuantizedExperts)
    assert isinstance(layer.experts.gate, QuantizedExperts)
    x = jax.random.normal(jax.random.key(5), (3, 6, 16))
    batched = eqx.filter_jit(lambda m, x: jax.vmap(m)(x)[0])
    ours = batched(layer, x)
    one = eqx.filter_jit(lambda m, row: m(row)[0])
    for row, out in zip(x, ours):
        np.testing.assert_allclose(one(layer, row), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batched(dense, x), ours, rtol=1e-5, atol=1e-5)


def test_int8_experts_are_close_to_float_and_a_quarter_of_the_bytes(model):
    quantized = zoo.lora.quantize(model)
    experts = quantized.layers.blocks.feed_forward.experts
    assert type(quantized.layers.blocks.feed_forward.router).__name__ == "Linear"  # float
    for name in EXPERTS:
        q, w = getattr(experts, name), getattr(model.layers.blocks.feed_forward.experts, name)
        assert q.weight.dtype == jnp.int8 and q.scale.shape == (2, 4, w.shape[-1])
        # rounding moves each weight by at most half a step (scale / 2)
        error = np.abs(np.asarray(q.dequantize() - w))
        assert (error <= np.asarray(q.scale)[..., None, :] / 2 + 1e-7).all()
        float_bytes, int8_bytes = w.nbytes, q.weight.nbytes + q.scale.nbytes
        assert int8_bytes <= float_bytes / 4 + q.scale.nbytes
    # one layer's experts: the output moves by at most sum_i |x_i| * step_i / 2 per column
    settings = MoESettings(num_experts=4, top_k=2, d_ff=8)
    layer = MoEFeedForward(16, settings, key=jax.random.key(6))
    rows = jax.random.normal(jax.random.key(7), (5, 16))
    sizes = jnp.array([1, 2, 0, 2], jnp.int32)
    q = QuantizedExperts.from_float(layer.experts.up)
    steps = np.asarray(q.scale)[np.repeat(np.arange(4), np.asarray(sizes))]  # [rows, out]
    bound = np.abs(np.asarray(rows)).sum(axis=1, keepdims=True) * steps / 2
    exact = np.asarray(jax.lax.ragged_dot(rows, layer.experts.up, sizes))
    error = np.abs(np.asarray(q.grouped(rows, sizes)) - exact)
    assert (error <= bound + 1e-5).all() and error.max() > 0


def test_qlora_experts_save_and_load_with_zoo_and_in_peft_format(model, adapted, tmp_path):
    trained = zoo.lora.quantize(randomize(adapted))
    zoo.save(trained, tmp_path / "zoo")
    again = zoo.load(tmp_path / "zoo")
    assert isinstance(again.layers.blocks.feed_forward.experts.gate.base, QuantizedExperts)
    np.testing.assert_array_equal(logits(again), logits(trained))
    zoo.lora.save_adapter(trained, tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["w1", "w2", "w3"]  # Mixtral's expert names
    import safetensors.numpy

    tensors = safetensors.numpy.load_file(tmp_path / "peft" / "adapter_model.safetensors")
    a = tensors["base_model.model.model.layers.1.block_sparse_moe.experts.3.w2.lora_A.weight"]
    down = lora_experts(trained)["layers.blocks.feed_forward.experts.down"]
    np.testing.assert_array_equal(a, np.asarray(down.lora_a[1, 3]).T)  # [rank, in]
    onto = zoo.lora.quantize(zoo.lora.load_adapter(model, tmp_path / "peft"))
    np.testing.assert_allclose(logits(onto), logits(trained), atol=1e-6)


@pytest.mark.slow
def test_cli_lora_on_int8_experts_learns_and_its_adapter_loads_back(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "gpt", "--preset", "mixtral-tiny", "--data", "synthetic:addition",
            "--batch-size", "8", "--lr", "1e-2", "--log-every", "1", "--eval-limit", "1",
            "--no-progress", "--json", "--steps", "5", "--out", str(out),
            "--lora", "rank=4,targets=experts", "--quantize", "int8"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if row["split"] == "train"]
    assert losses[-1] < losses[0] - 0.05
    run = zoo.load(out)
    experts = run.layers.blocks.feed_forward.experts
    assert isinstance(experts.gate, LoRAExperts) and isinstance(experts.gate.base, QuantizedExperts)
    tokens = TOKENS % run.config.vocab_size
    again = zoo.lora.load_adapter(_base_of(run), out / "adapter")  # the PEFT folder
    np.testing.assert_allclose(logits(again, tokens), logits(run, tokens), atol=1e-6)
    np.testing.assert_allclose(logits(zoo.lora.merge(run), tokens), logits(run, tokens), atol=1e-5)


def _base_of(model):
    """`model` without its expert adapters (their frozen bases in place)."""
    return jax.tree_util.tree_map(
        lambda n: n.base if isinstance(n, LoRAExperts) else n,
        model,
        is_leaf=lambda n: isinstance(n, LoRAExperts),
    )
