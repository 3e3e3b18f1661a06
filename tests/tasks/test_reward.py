"""Reward modelling: the Bradley-Terry loss by hand, the score of the last real token, errors."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.data.chat.preference import PreferencePair, pair_arrays
from zoo.models import with_score_head
from zoo.tasks import RewardModeling, pair_rewards

PAIRS = [
    PreferencePair([1, 5, 9], [6, 7, 20, 2], [8, 2]),
    PreferencePair([1, 9, 10, 11, 3], [12, 2], [13, 14, 15, 30, 2]),
]


@pytest.fixture(scope="module")
def scorer():
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)
    return with_score_head(model, key=jax.random.key(3))


def batch_of(**extra):
    arrays = pair_arrays(PAIRS, pad_id=0, positions=False)
    return {k: jnp.asarray(v) for k, v in {**arrays, **extra}.items()}


def test_loss_and_metrics_by_hand(scorer):
    margin = np.array([0.3, -1.0], np.float32)
    batch = batch_of(margin=margin)
    rewards = np.asarray(pair_rewards(scorer, batch)[0], np.float64)
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    center = 0.2
    loss, metrics = RewardModeling(center_rewards=center)(scorer, batch)
    expected = np.mean(np.log1p(np.exp(-(chosen - rejected - margin))))
    expected += center * np.mean((chosen + rejected) ** 2)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["margin"]), np.mean(chosen - rejected), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["mean_reward"]), np.mean(rewards), rtol=1e-5)
    assert float(metrics["accuracy"]) == np.mean(chosen > rejected)
    assert float(metrics["loss"]) == float(loss)


def test_a_gpt_scores_its_last_real_token_whatever_the_padding(scorer):
    row = jnp.array([1, 5, 9, 6, 7])
    alone = scorer.scores_and_router(row).output
    padded = scorer.scores_and_router(jnp.concatenate([row, jnp.zeros(4, row.dtype)])).output
    by_hand = scorer.score(scorer.features(row)[-1])
    np.testing.assert_allclose(np.asarray(alone), np.asarray(by_hand), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(padded), np.asarray(alone), rtol=1e-5, atol=1e-6)
    # an explicit mask decides where the row ends, not the token ids
    masked = scorer.scores_and_router(row, jnp.arange(5) < 3).output
    np.testing.assert_allclose(np.asarray(masked), np.asarray(scorer.score(
        scorer.features(row[:3])[-1])), rtol=1e-5, atol=1e-6)  # fmt: skip


def test_a_score_head_leaves_the_language_model_as_it_was():
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)
    built = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16,
                       **{"head.scores": 1})  # fmt: skip
    tokens = jnp.array([1, 4, 6, 8])
    np.testing.assert_array_equal(np.asarray(built(tokens)), np.asarray(model(tokens)))
    scored = with_score_head(model)
    np.testing.assert_array_equal(np.asarray(scored(tokens)), np.asarray(model(tokens)))
    assert scored.score is not None and scored.score.weight.shape == (1, model.config.d_model)
    assert built.config.head.scores == 1 and model.score is None


def test_a_one_class_classifier_trains_as_a_reward_model():
    model = zoo.create("classifier-tiny", key=jax.random.key(0), vocab_size=32, num_classes=1)
    task = RewardModeling()
    batch = batch_of()
    task.check_model(model)
    task.check_batch(batch, model)
    grads = eqx.filter_grad(lambda m: task(m, batch)[0])(model)
    assert float(jnp.abs(grads.head.weight).sum()) > 0
    # chosen and rejected swapped: the margin changes sign
    swapped = {**batch, "tokens": batch["tokens"][:, ::-1], "lengths": batch["lengths"][:, ::-1]}
    margin = float(task(model, batch)[1]["margin"])
    np.testing.assert_allclose(float(task(model, swapped)[1]["margin"]), -margin, rtol=1e-5)


def test_wrong_models_and_batches_are_refused(scorer):
    task = RewardModeling()
    two = zoo.create("classifier-tiny", key=jax.random.key(0), vocab_size=32, num_classes=2)
    with pytest.raises(TypeError, match="num_classes=1"):
        task.check_model(two)
    plain = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)
    with pytest.raises(TypeError, match="with_score_head"):
        task.check_model(plain)
    with pytest.raises(ValueError, match="no score head"):
        plain.scores_and_router(jnp.array([1, 2]))
    batch = batch_of()
    with pytest.raises(ValueError, match="missing \\['lengths'\\]"):
        task.check_batch({"tokens": batch["tokens"]}, scorer)
    with pytest.raises(ValueError, match="margin"):
        task.check_batch({**batch, "margin": jnp.zeros(3)}, scorer)
    with pytest.raises(ValueError, match="NaN"):
        task.check_batch({**batch, "margin": jnp.array([0.0, jnp.nan])}, scorer)
    with pytest.raises(ValueError, match="center_rewards"):
        RewardModeling(center_rewards=-1.0)


def test_a_score_head_the_export_cannot_write_is_refused():
    """GPT-2 has no sequence-classification mapping: the score head is not dropped silently."""
    from zoo.interop import UnsupportedExport
    from zoo.interop.export import to_state_dict

    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)
    with pytest.raises(UnsupportedExport, match="head.scores=1"):
        to_state_dict(with_score_head(model))
    arrays, config = to_state_dict(with_score_head(zoo.create(
        "llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)))  # fmt: skip
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert config["num_labels"] == 1 and arrays["score.weight"].shape[0] == 1
    assert "lm_head.weight" not in arrays
