"""Training adapters only: the base stays bit-identical and the optimizer holds adapter state only."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

import zoo
from tests.lora.helpers import TOKENS
from zoo.train.checkpoint import state_arrays
from zoo.train.step import make_train_step
from zoo.tree import named_arrays, path_name


def test_a_step_moves_only_the_adapters_and_state_is_adapter_sized(key):
    model = zoo.create("llama-tiny", key=key)
    adapted = zoo.lora.apply(model, rank=4, alpha=8, targets="attention", key=key)
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2, weight_decay=0.1))
    params = eqx.filter(adapted, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(params)
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer)
    before = {name: np.asarray(a) for name, a in named_arrays(adapted).items()}
    trained, state, _ = step(adapted, state, {"tokens": TOKENS}, key, 0)
    trained, state, _ = step(trained, state, {"tokens": TOKENS}, key, 1)
    after = {name: np.asarray(a) for name, a in named_arrays(trained).items()}
    adapters = {name for name in before if name.endswith((".lora_a", ".lora_b"))}
    assert len(adapters) == 8  # A and B of 4 projections, stacked over the 2 layers
    for name in before:
        if name in adapters:
            assert not np.array_equal(after[name], before[name]), name
        else:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # AdamW keeps two moments per trained number and nothing for the frozen base
    adapter_bytes = sum(before[name].nbytes for name in adapters)
    state_bytes = {name: a.nbytes for name, a in state_arrays(state).items()}
    moments = sum(n for name, n in state_bytes.items() if not name.endswith("count"))
    assert moments == 2 * adapter_bytes
    assert sum(state_bytes.values()) - moments <= 16  # the step counters
    # d_model 64, 4 heads of 16, 2 kv heads: q and o are 64x64, k and v 32x64 (out x in)
    assert adapter_bytes == 4 * 2 * 4 * ((64 + 64) * 2 + (64 + 32) * 2)


def test_train_extra_arrays_alongside_the_adapters(key):
    model = zoo.create("classifier-tiny", key=key)
    adapted = zoo.lora.apply(model, rank=2, targets="attention.qv", key=key)
    labels = zoo.lora.trainable_labels(eqx.filter(adapted, eqx.is_inexact_array), ("head",))
    flat = {path_name(p): label for p, label in jax.tree_util.tree_flatten_with_path(labels)[0]}
    trained = sorted(name for name, label in flat.items() if label == "train")
    assert trained == [
        "encoder.blocks.self_attention.query_proj.lora_a",
        "encoder.blocks.self_attention.query_proj.lora_b",
        "encoder.blocks.self_attention.value_proj.lora_a",
        "encoder.blocks.self_attention.value_proj.lora_b",
        "head.bias",
        "head.weight",
    ]


def test_save_and_load_keep_the_adapters(key, tmp_path):
    from tests.lora.helpers import forward, randomize_adapters

    model = zoo.create("gpt-tiny", key=key)
    adapted = randomize_adapters(
        zoo.lora.apply(model, rank=2, alpha=5, targets="attention", key=key)
    )
    zoo.save(adapted, tmp_path)
    loaded = zoo.load(tmp_path)
    assert zoo.lora.describe(loaded) == zoo.lora.describe(adapted)
    assert zoo.lora.describe(loaded)["layers.blocks.self_attention.query_proj"] == {
        "rank": 2,
        "alpha": 5.0,
    }
    np.testing.assert_array_equal(forward(loaded), forward(adapted))


def _train_steps(adapted, key, *, steps: int, **step_options):
    """`steps` updates of the adapters on a copy of `adapted` (the step donates its input)."""
    adapted = jax.tree_util.tree_map(lambda x: x.copy() if eqx.is_array(x) else x, adapted)
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2))
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(eqx.filter(adapted, eqx.is_inexact_array))
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer, **step_options)
    losses = []
    for index in range(steps):
        adapted, state, out = step(adapted, state, {"tokens": TOKENS}, key, index)
        losses.append(float(out.stats.loss_sum / out.stats.weight))
    return adapted, losses


def _changed(before, after) -> set[str]:
    """Names of the arrays that differ; asserts every other array is bit-for-bit equal."""
    new = named_arrays(after)
    assert before.keys() == new.keys()
    return {name for name in before if not np.array_equal(before[name], np.asarray(new[name]))}


@pytest.mark.slow
def test_bf16_and_accumulation_train_only_the_adapters(key):
    model = zoo.create("gpt-tiny", key=key)
    adapted = zoo.lora.apply(model, rank=4, alpha=8, targets="attention", key=key)
    before = {name: np.asarray(a) for name, a in named_arrays(adapted).items()}
    adapters = {name for name in before if name.endswith((".lora_a", ".lora_b"))}
    assert len(adapters) == 8
    runs = {
        "fp32": _train_steps(adapted, key, steps=3),
        "accumulate": _train_steps(adapted, key, steps=3, accumulate=2),
        "bf16+accumulate": _train_steps(adapted, key, steps=3, precision="bf16", accumulate=2),
    }
    for name, (trained, losses) in runs.items():
        assert _changed(before, trained) == adapters, name  # the base is bit-identical
        assert all(np.isfinite(losses)), (name, losses)
        # the master adapter weights stay float32 under bf16 compute
        assert all(named_arrays(trained)[a].dtype == np.float32 for a in adapters), name
    # two micro-batches sum to the whole batch's gradient: the same adapters up to rounding
    fp32, accumulated = named_arrays(runs["fp32"][0]), named_arrays(runs["accumulate"][0])
    for name in adapters:
        np.testing.assert_allclose(accumulated[name], fp32[name], atol=1e-5, err_msg=name)
    np.testing.assert_allclose(runs["accumulate"][1], runs["fp32"][1], rtol=1e-5)
    # bf16 compute follows the fp32 losses to bf16 precision
    np.testing.assert_allclose(runs["bf16+accumulate"][1], runs["fp32"][1], rtol=2e-2)


def test_frozen_weights_get_no_gradient_and_the_update_is_unchanged(key):
    """The step differentiates the adapters only: the frozen base's weight gradients (one
    matrix product per frozen Linear) are not computed, and the update is the same."""
    model = zoo.lora.apply(
        zoo.create("llama-tiny", key=key), rank=4, alpha=8, targets="attention", key=key
    )
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2))
    everything = optimizer._replace(labels=None)  # the same optimizer, gradients for all arrays
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    task = zoo.tasks.LanguageModeling()
    batch = {"tokens": TOKENS}
    adapters_only, full = (make_train_step(task, o) for o in (optimizer, everything))

    def matmuls(step):
        return step.lower(model, state, batch, key).as_text().count("stablehlo.dot_general")

    # the frozen weights (attention and feed-forward projections, the head) lose their
    # weight-gradient products: 46 against 50 products in the program with jax 0.10
    assert matmuls(adapters_only) < matmuls(full)
    copy = jax.tree_util.tree_map(lambda a: a.copy() if eqx.is_array(a) else a, (model, state))
    ours, _, out = adapters_only(*copy, batch, key, 0)
    reference, _, reference_out = full(model, state, batch, key, 0)
    np.testing.assert_allclose(out.stats.loss_sum, reference_out.stats.loss_sum, rtol=1e-6)
    for name, value in named_arrays(ours).items():
        np.testing.assert_allclose(value, named_arrays(reference)[name], atol=1e-6, err_msg=name)
    # the reported gradient norm is that of the trained arrays
    assert 0 < float(out.grad_norm) < float(reference_out.grad_norm)
