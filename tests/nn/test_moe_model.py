"""A mixture-of-experts GPT end to end: the task's router losses, padding, cached decoding,
training with an exact resume, LoRA beside the experts."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.train.helpers import lm_batches, params
from zoo.nn.lora import linear_paths
from zoo.nn.moe import expert_load, router_losses
from zoo.tasks import LanguageModeling
from zoo.train import LoopSettings, Outputs, Trainer, adamw

TOKENS = jnp.array([[5, 9, 13, 7, 22, 40, 3, 11], [1, 30, 31, 32, 17, 4, 0, 0]], jnp.int32)


@pytest.fixture(scope="module")
def model():
    return zoo.create("qwen2-moe-tiny", key=jax.random.key(0), remat=None)


def test_the_objective_adds_the_weighted_router_losses(model):
    task = LanguageModeling()
    batch = {"tokens": TOKENS}
    plain = task.statistics(model, batch)
    _, router = jax.vmap(model.features_and_router)(TOKENS[:, :-1])
    balance, z = router_losses(router)
    experts = model.config.experts()
    coefs = experts.aux_loss_coef, experts.z_loss_coef
    assert coefs == (0.001, 0.0)
    expected = plain.nll_sum + plain.weight * (coefs[0] * balance)
    np.testing.assert_allclose(plain.loss_sum, expected, rtol=1e-6)
    _, metrics = task(model, batch)
    np.testing.assert_allclose(metrics["router_aux_loss"], balance, rtol=1e-6)
    np.testing.assert_allclose(metrics["router_z_loss"], z, rtol=1e-6)
    np.testing.assert_allclose(metrics["expert_load"], expert_load(router), rtol=1e-6)
    assert float(balance) >= 2.0 - 1e-6  # top-2: the uniform load gives exactly 2


def test_padding_is_left_out_of_the_router_statistics(model):
    """A right-padded row routes its real tokens as the unpadded row does, and counts only them."""
    _, padded = model.features_and_router(TOKENS[1])
    _, alone = model.features_and_router(TOKENS[1, :6])
    for a, b in zip(jax.tree.leaves(padded), jax.tree.leaves(alone), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert float(padded.tokens) == 6 * model.config.num_layers


def test_cached_decoding_equals_the_full_forward(model):
    tokens = TOKENS[0]
    full = model(tokens)
    logits, cache = model.prefill(tokens[:5], max_len=16)
    np.testing.assert_allclose(logits, full[:5], atol=1e-5)
    for position in range(5, 8):
        step, cache = model.extend(tokens[position : position + 1], cache)
        np.testing.assert_allclose(step[0], full[position], atol=1e-5)


def test_training_logs_router_metrics_and_resumes_exactly(tmp_path):
    model = zoo.create("mixtral-tiny", key=jax.random.key(0), **{"feed_forward.z_loss_coef": 1e-3})
    trainer = Trainer(
        LanguageModeling(),
        adamw(3e-3, warmup=2),
        loop=LoopSettings(log_every=1, checkpoint_every=2, progress=False),
    )
    data, key = lm_batches(num=32, batch_size=4), jax.random.key(1)
    full, history = trainer.fit(model, data, steps=4, key=key, outputs=Outputs(tmp_path / "full"))
    trainer.fit(model, data, steps=2, key=key, outputs=Outputs(tmp_path / "run"))
    resumed, again = trainer.fit(
        model, data, steps=4, key=key, outputs=Outputs(tmp_path / "run"), resume=True
    )
    assert again.summary["resumed_from"] == 2
    assert again.losses() == history.losses()
    for name, array in params(full).items():
        np.testing.assert_array_equal(params(resumed)[name], array, err_msg=name)
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").open()]
    metrics = rows[0]["metrics"]
    assert set(metrics) >= {"router_aux_loss", "router_z_loss", "expert_load"}
    assert metrics["router_aux_loss"] >= 2.0 - 1e-4 and metrics["expert_load"] >= 1.0


def test_lora_all_linear_leaves_the_router_alone(model):
    paths = linear_paths(model)
    assert "layers.blocks.feed_forward.router" in paths
    adapted = zoo.lora.apply(model, targets="all-linear", rank=2, key=jax.random.key(1))
    adapted_paths = set(zoo.nn.lora.lora_layers(adapted))
    assert "layers.blocks.feed_forward.router" not in adapted_paths
    assert "layers.blocks.feed_forward.shared_gate" not in adapted_paths
    assert "layers.blocks.feed_forward.shared.gate" in adapted_paths  # the shared expert
    assert "layers.blocks.self_attention.query_proj" in adapted_paths
    # fresh adapters (B = 0) leave the logits alone
    np.testing.assert_allclose(adapted(TOKENS[0]), model(TOKENS[0]), atol=1e-6)


def test_int8_base_keeps_the_router_float_and_quantizes_the_experts():
    model = zoo.create("mixtral-tiny", key=jax.random.key(0), remat=None)
    quantized = zoo.lora.quantize(model)
    assert type(quantized.layers.blocks.self_attention.query_proj).__name__ == "QuantizedLinear"
    assert type(quantized.layers.blocks.feed_forward.router).__name__ == "Linear"
    assert quantized.layers.blocks.feed_forward.experts.gate.weight.dtype == jnp.int8
    tokens = TOKENS[0]
    ours, full = quantized(tokens), model(tokens)
    assert float(jnp.max(jnp.abs(ours - full))) < 0.05 * float(jnp.max(jnp.abs(full)))
