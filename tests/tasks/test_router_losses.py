"""Every task that trains a mixture of experts adds its router losses: a classifier, a masked-LM
encoder and a translator with experts as a GPT does, each weighted as the experts' settings say
and logged by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.data.chat.preference import PreferencePair, pair_arrays
from zoo.nn import MoESettings
from zoo.nn.moe import router_losses
from zoo.tasks import (
    Classification,
    MaskedLanguageModeling,
    Preference,
    PreferenceLoss,
    Translation,
)

EXPERTS = MoESettings(num_experts=4, top_k=2, d_ff=32, aux_loss_coef=0.5, z_loss_coef=0.01)
TOKENS = jnp.asarray([[5, 9, 3, 17, 22, 8, 0, 0], [7, 30, 12, 4, 6, 11, 2, 40]], jnp.int32)


def routed(preset: str, **changes: object):
    return zoo.create(preset, key=jax.random.key(0), feed_forward=EXPERTS, **changes)


def without_router_losses(model):
    """The same weights, the router losses weighted 0."""
    config = model.config.replace(
        **{"feed_forward.aux_loss_coef": 0.0, "feed_forward.z_loss_coef": 0.0}
    )
    return type(model)(config, key=jax.random.key(0))


@pytest.mark.parametrize(
    ("preset", "task", "batch"),
    [
        ("classifier-tiny", Classification(), {"tokens": TOKENS, "labels": jnp.asarray([0, 1])}),
        ("translator-tiny", Translation(), {"src": TOKENS, "tgt": TOKENS[:, ::-1]}),
    ],
    ids=["classifier", "translator"],
)
def test_the_objective_adds_the_weighted_router_losses(preset, task, batch):
    model = routed(preset)
    loss, metrics = task(model, batch)
    plain_loss, plain = task(without_router_losses(model), batch)
    balance, z = metrics["router_aux_loss"], metrics["router_z_loss"]
    assert float(balance) > 1.0  # the load-balancing loss is top_k (2) when balanced
    np.testing.assert_allclose(plain["router_aux_loss"], balance, rtol=1e-6)  # the same router
    np.testing.assert_allclose(loss - plain_loss, 0.5 * balance + 0.01 * z, rtol=1e-5)


def test_a_classifiers_router_statistics_are_its_real_tokens_through_every_layer():
    model = routed("classifier-tiny")
    logits, router = jax.vmap(model.logits_and_router)(TOKENS)
    np.testing.assert_allclose(logits, jax.vmap(model)(TOKENS), atol=1e-6)
    # 6 and 8 real tokens (pad_id 0), through each of the 2 layers
    np.testing.assert_allclose(router.tokens, [12.0, 16.0])
    balance, _ = router_losses(router)
    _, metrics = Classification()(model, {"tokens": TOKENS, "labels": jnp.asarray([0, 1])})
    np.testing.assert_allclose(metrics["router_aux_loss"], balance, rtol=1e-6)


def test_masked_lm_pretraining_adds_them_too():
    model = routed("classifier-tiny", masked_lm=True, mask_id=3)
    task = MaskedLanguageModeling(0.5)
    loss, metrics = task(model, {"tokens": TOKENS})
    plain_loss, _ = task(without_router_losses(model), {"tokens": TOKENS})
    expected = 0.5 * metrics["router_aux_loss"] + 0.01 * metrics["router_z_loss"]
    np.testing.assert_allclose(loss - plain_loss, expected, rtol=1e-5)


@pytest.mark.parametrize("kind", ["sigmoid", "simpo"])  # with a reference model, and without
def test_preference_training_adds_them_as_trl_does(kind):
    """DPO and its relatives on experts add the router losses of the chosen and rejected rows."""
    model = routed("llama-tiny", vocab_size=48, max_positions=16)
    pairs = [
        PreferencePair([1, 5], [6, 7, 2], [8, 2]),
        PreferencePair([1, 9, 10], [12, 2], [13, 2]),
    ]
    batch = pair_arrays(pairs, pad_id=0)
    task = Preference(PreferenceLoss(kind=kind), reference="batch")
    if kind == "sigmoid":
        batch = {**batch, "reference_logps": np.full((2, 2), -9.0, np.float32)}
    loss, metrics = task(model, batch)
    plain_loss, _ = task(without_router_losses(model), batch)
    expected = 0.5 * metrics["router_aux_loss"] + 0.01 * metrics["router_z_loss"]
    assert float(metrics["router_aux_loss"]) > 1.0
    np.testing.assert_allclose(loss - plain_loss, expected, rtol=1e-5)


def test_a_dense_model_logs_no_router_losses():
    _, metrics = Classification()(
        zoo.create("classifier-tiny", key=jax.random.key(0)),
        {"tokens": TOKENS, "labels": jnp.asarray([0, 1])},
    )
    assert "router_aux_loss" not in metrics
