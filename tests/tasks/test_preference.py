"""Preference losses on hand-computed numbers, and the reference modes agreeing."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
import zoo.lora
from zoo.data.chat.preference import PreferencePair, pair_arrays
from zoo.tasks import Preference, PreferenceLoss, adapter_values, answer_logps, with_reference
from zoo.tasks.preference_loss import pair_losses

LOGPS = np.array([[-3.0, -5.0], [-4.0, -2.5]], np.float32)  # policy: (chosen, rejected)
REFERENCE = np.array([[-3.5, -4.0], [-4.2, -3.0]], np.float32)
TOKENS = np.array([[2.0, 4.0], [3.0, 1.0]], np.float32)


def softplus(x: float) -> float:  # -log sigmoid(-x)
    return math.log1p(math.exp(x))


def losses(kind: str, **settings) -> np.ndarray:
    loss = PreferenceLoss(kind=kind, **settings)
    terms = pair_losses(loss, jnp.asarray(LOGPS), jnp.asarray(REFERENCE), jnp.asarray(TOKENS))
    return np.asarray(terms["loss"])


def deltas() -> list[float]:
    # (chosen - ref) - (rejected - ref): pair 0 (0.5) - (-1.0) = 1.5; pair 1 (0.2) - (0.5) = -0.3
    return [1.5, -0.3]


def test_dpo_family_losses_by_hand():
    beta = 0.5
    np.testing.assert_allclose(
        losses("sigmoid", beta=beta), [softplus(-beta * d) for d in deltas()], rtol=1e-6
    )
    np.testing.assert_allclose(
        losses("hinge", beta=beta), [max(0.0, 1 - beta * d) for d in deltas()], rtol=1e-6
    )
    eps = 0.2
    robust = [
        ((1 - eps) * softplus(-beta * d) - eps * softplus(beta * d)) / (1 - 2 * eps)
        for d in deltas()
    ]
    np.testing.assert_allclose(losses("robust", beta=beta, label_smoothing=eps), robust, rtol=1e-6)
    # IPO: each side's log-ratio per token: pair 0: 0.5/2 - (-1.0)/4 = 0.5; pair 1: 0.2/3 - 0.5
    ipo = [(0.5 - 1.0) ** 2, (0.2 / 3 - 0.5 - 1.0) ** 2]
    np.testing.assert_allclose(losses("ipo", beta=beta), ipo, rtol=1e-5)


def test_reference_free_losses_by_hand():
    beta, gamma = 2.0, 0.4
    averages = LOGPS / TOKENS  # pair 0: (-1.5, -1.25), pair 1: (-4/3, -2.5)
    simpo = [softplus(-(beta * (c - r) - gamma)) for c, r in averages]
    np.testing.assert_allclose(losses("simpo", beta=beta, gamma=gamma), simpo, rtol=1e-6)

    def log_odds(p: float) -> float:
        return p - math.log1p(-math.exp(p))

    orpo = [-beta * -softplus(-(log_odds(c) - log_odds(r))) for c, r in averages]
    np.testing.assert_allclose(losses("orpo", beta=beta), orpo, rtol=1e-5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        PreferenceLoss(kind="kto")
    with pytest.raises(ValueError, match="robust loss"):
        PreferenceLoss(kind="sigmoid", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        PreferenceLoss(beta=0.0)


PAIRS = [
    PreferencePair([1, 5], [6, 7, 2], [8, 2]),
    PreferencePair([1, 9, 10, 11], [12, 2], [13, 14, 15, 2]),
]


def tiny_model(seed: int = 0):
    return zoo.create("llama-tiny", key=jax.random.key(seed), vocab_size=32, max_positions=16)


def one_batch():
    return pair_arrays(PAIRS, pad_id=0)


def test_answer_logps_sum_the_answer_tokens():
    model, batch = tiny_model(), one_batch()
    logps, counts = answer_logps(model, batch)
    np.testing.assert_array_equal(np.asarray(counts), [[3, 2], [2, 4]])
    rows = batch["tokens"].reshape(4, -1)  # causal: the padding after a row changes nothing
    log_probs = np.asarray(jax.nn.log_softmax(jax.vmap(model)(jnp.asarray(rows[:, :-1])), -1))
    for row, pair in enumerate(PAIRS):
        for side, answer in enumerate((pair.chosen, pair.rejected)):
            ids = pair.prompt + answer
            start = len(pair.prompt) - 1
            picked = [log_probs[row * 2 + side, t, ids[t + 1]] for t in range(start, len(ids) - 1)]
            assert float(logps[row, side]) == pytest.approx(sum(picked), rel=1e-5)


def test_metrics_follow_the_rewards():
    model, reference = tiny_model(0), tiny_model(1)
    batch = with_reference(_source(), reference).batch(0)
    task = Preference(PreferenceLoss(beta=0.3))
    loss, metrics = task(model, batch)
    policy, _ = answer_logps(model, batch)
    ratios = 0.3 * (np.asarray(policy) - batch["reference_logps"])
    assert float(metrics["rewards/chosen"]) == pytest.approx(ratios[:, 0].mean(), rel=1e-5)
    assert float(metrics["rewards/margins"]) == pytest.approx(
        (ratios[:, 0] - ratios[:, 1]).mean(), rel=1e-5
    )
    assert float(metrics["rewards/accuracies"]) == np.mean(ratios[:, 0] > ratios[:, 1])
    assert float(metrics["logps/rejected"]) == pytest.approx(float(policy[:, 1].mean()), rel=1e-5)
    expected = np.mean([softplus(-(c - r)) for c, r in ratios])
    assert float(loss) == pytest.approx(expected, rel=1e-5)


class _Source:
    def __init__(self, batch):
        self.arrays = batch

    def __len__(self):
        return 1

    def batch(self, step):
        return dict(self.arrays)


def _source():
    return _Source(one_batch())


def test_reference_modes_agree_at_the_start():
    """Frozen copy (on the fly) == precomputed == the LoRA model's base with adapters off."""
    base = tiny_model()
    adapted = zoo.lora.apply(base, rank=2, alpha=4, targets="attention", key=jax.random.key(3))
    # move the policy away from its base so that the loss is not log 2
    adapted = jax.tree_util.tree_map(
        lambda node: node.__class__(node.base, node.lora_a, node.lora_b + 0.05, alpha=node.alpha)
        if isinstance(node, zoo.lora.LoRALinear) else node,
        adapted, is_leaf=lambda node: isinstance(node, zoo.lora.LoRALinear),
    )  # fmt: skip
    task = Preference(PreferenceLoss(beta=0.5))
    batches = zoo.data.ArrayBatches(one_batch(), batch_size=2, shuffle=False)
    copy_loss, _ = task(adapted, with_reference(batches, base).batch(0))
    pre_loss, _ = task(adapted, with_reference(batches, base, precompute=True).batch(0))
    off_loss, _ = Preference(PreferenceLoss(beta=0.5), reference="adapters")(
        adapted, batches.batch(0)
    )
    assert abs(float(copy_loss) - math.log(2)) > 1e-3
    assert float(pre_loss) == pytest.approx(float(copy_loss), rel=1e-6)
    assert float(off_loss) == pytest.approx(float(copy_loss), rel=1e-6)
    # at zero-initialised B every mode gives log 2
    fresh = zoo.lora.apply(base, rank=2, alpha=4, targets="attention", key=jax.random.key(3))
    off_fresh, _ = Preference(reference="adapters")(fresh, batches.batch(0))
    assert float(off_fresh) == pytest.approx(math.log(2), rel=1e-6)


def test_a_continued_adapter_is_compared_with_the_model_it_started_from():
    """reference_adapters: the reference is the starting model (base + its adapters' starting
    values), as a frozen copy of that model gives, not the base with the adapters off."""
    from tests.lora.helpers import randomize_adapters

    base = tiny_model()
    adapted = zoo.lora.apply(base, rank=2, alpha=4, targets="attention", key=jax.random.key(3))
    start = randomize_adapters(adapted, seed=1)  # a trained adapter: B is not zero
    policy = randomize_adapters(adapted, seed=2)  # the same adapter trained further
    task = Preference(
        PreferenceLoss(beta=0.5),
        reference="adapters",
        reference_adapters=adapter_values(start),
    )
    batches = zoo.data.ArrayBatches(one_batch(), batch_size=2, shuffle=False)
    loss, _ = task(policy, batches.batch(0))
    frozen_copy, _ = Preference(PreferenceLoss(beta=0.5))(
        policy, with_reference(batches, start).batch(0)
    )
    base_reference, _ = Preference(PreferenceLoss(beta=0.5), reference="adapters")(
        policy, batches.batch(0)
    )
    assert float(loss) == pytest.approx(float(frozen_copy), rel=1e-6)
    assert abs(float(loss) - float(base_reference)) > 1e-3
    at_start, _ = task(start, batches.batch(0))
    assert float(at_start) == pytest.approx(math.log(2), rel=1e-6)
    # the policy's adapters are what the gradient reaches: the reference's values are constants
    grads = eqx.filter_grad(lambda model: task.statistics(model, batches.batch(0)).loss_sum)(policy)
    assert all(
        float(jnp.abs(layer.lora_b).max()) > 0 for layer in zoo.lora.lora_layers(grads).values()
    )
    with pytest.raises(ValueError, match="LoRA adapters"):
        task(base, batches.batch(0))  # no adapters to hold the values


def test_accumulated_step_equals_the_whole_batch():
    model = tiny_model()
    pairs = PAIRS * 2
    batches = with_reference(
        zoo.data.ArrayBatches(pair_arrays(pairs, 0), batch_size=4, shuffle=False), tiny_model(1)
    )
    outputs = []
    for accumulate in (1, 2):
        trainer = zoo.Trainer(Preference(), zoo.train.adamw(1e-2), accumulate=accumulate)
        step = trainer.train_step
        state = trainer.init_optimizer(model)
        copy = jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, model)
        _, _, output = step(copy, state, batches.batch(0), jax.random.key(0), 0)
        outputs.append(output)
    assert float(outputs[0].stats.loss) == pytest.approx(float(outputs[1].stats.loss), rel=1e-5)
    for name, value in outputs[0].stats.extra.items():
        assert float(outputs[1].stats.extra[name]) == pytest.approx(
            float(value), rel=1e-5, abs=1e-6
        )
    assert float(outputs[0].grad_norm) == pytest.approx(float(outputs[1].grad_norm), rel=1e-4)


def test_batch_errors_say_what_is_missing():
    model = tiny_model()
    with pytest.raises(ValueError, match="reference_logps"):
        Preference().check_batch(one_batch(), model)
    Preference(PreferenceLoss(kind="simpo")).check_batch(one_batch(), model)  # reference-free
    bad = one_batch()
    bad["loss_mask"][1, 0] = 0
    with pytest.raises(ValueError, match="pair 1 of the batch has no chosen answer token"):
        Preference(PreferenceLoss(kind="orpo")).check_batch(bad, model)


def test_answer_positions_give_the_same_log_probabilities_and_loss():
    # long prompts, short answers: the batch lists the answers' positions (capacity 8 of 21)
    pairs = [
        PreferencePair([1, *range(3, 21)], [20, 2], [21, 22, 2]),
        PreferencePair([1, *range(13, 19)], [23, 24, 25, 2], [26, 2]),
    ]
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=32)
    listed = pair_arrays(pairs, pad_id=0)
    full = pair_arrays(pairs, pad_id=0, positions=False)
    assert listed["loss_positions"].shape == (2, 2, 8) and "loss_positions" not in full
    # pair 0's chosen answer is tokens 19-20 of its row: predicted at target positions 18-19
    assert listed["loss_positions"][0, 0].tolist() == [18, 19, -1, -1, -1, -1, -1, -1]
    for a, b in zip(answer_logps(model, listed), answer_logps(model, full), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    task = Preference(PreferenceLoss(beta=0.3), reference="adapters")
    adapted = zoo.lora.apply(model, rank=2, key=jax.random.key(3))

    def gradients(batch):
        def loss(model):
            return task.statistics(model, batch).loss_sum

        return eqx.filter_grad(loss)(adapted)

    for a, b in zip(
        jax.tree_util.tree_leaves(gradients(listed)),
        jax.tree_util.tree_leaves(gradients(full)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    Preference(PreferenceLoss(), reference="adapters").check_batch(listed, model)
    broken = {**listed, "loss_positions": listed["loss_positions"].copy()}
    broken["loss_positions"][1, 0, 0] = -1
    with pytest.raises(ValueError, match="leaves out target position 6 of row 2"):
        Preference(PreferenceLoss(), reference="adapters").check_batch(broken, model)
