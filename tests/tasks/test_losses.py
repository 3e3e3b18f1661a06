"""Task losses against hand-computed values: stub models with fixed logits, numpy log-softmax."""

from __future__ import annotations

from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models import Routed
from zoo.nn import VocabHead
from zoo.tasks import Classification, LanguageModeling, Translation

VOCAB = 6


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# Row i: the logits a stub model outputs after reading token i.
TABLE = np.array(
    [
        [9.0, -3.0, 4.0, 0.5, 2.0, 7.0],  # after pad: never scored, so any values
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
        [1.0, 0.0, 0.0, 2.0, 0.0, 0.0],
        [0.0, 1.5, -1.0, 0.0, 3.0, 0.0],
        [2.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        [0.0, 0.0, 0.5, 0.5, 0.0, 2.5],
    ],
    dtype=np.float32,
)
LOGP = log_softmax(TABLE.astype(np.float64))


class NextTokenStub(eqx.Module):
    """GPT-shaped: logits at position t are TABLE[tokens[t]]."""

    table: jax.Array
    config: SimpleNamespace = eqx.field(static=True)

    def __call__(self, tokens, mask=None, *, key=None):
        return self.table[tokens]

    # features one-hot, head the table: the same logits along the loss's own path
    def features_and_router(self, tokens, mask=None, *, segments=None, key=None):
        return Routed(jax.nn.one_hot(tokens, self.table.shape[0], dtype=self.table.dtype), None)

    @property
    def output_head(self):
        return VocabHead(self.table.T)


class TranslatorStub(eqx.Module):
    """Translator-shaped: ignores the source, logits at t are TABLE[tgt[t]]."""

    table: jax.Array
    config: SimpleNamespace = eqx.field(static=True)

    def __call__(self, src, tgt, src_mask=None, *, key=None):
        return self.table[tgt]

    def features_and_router(self, src, tgt, src_mask=None, *, key=None):
        return Routed(jax.nn.one_hot(tgt, self.table.shape[0], dtype=self.table.dtype), None)

    @property
    def output_head(self):
        return VocabHead(self.table.T)


class ClassifierStub(eqx.Module):
    """Classifier-shaped: class logits are TABLE[tokens[0], :3]."""

    table: jax.Array
    config: SimpleNamespace = eqx.field(static=True)

    def logits_and_router(self, tokens, mask=None, token_types=None, *, key=None):
        return Routed(self.table[tokens[0], :3], None)


def stub(cls, pad_id=0, table=TABLE):
    return cls(jnp.asarray(table), SimpleNamespace(pad_id=pad_id))


def test_language_modeling_loss_by_hand_skips_padding():
    tokens = np.array([[1, 3, 4, 0], [5, 2, 0, 0]], np.int32)
    loss, metrics = LanguageModeling()(stub(NextTokenStub), {"tokens": tokens})
    # Scored (input -> target): 1->3, 3->4, 5->2; the targets equal to pad (0) are skipped.
    nll = [-LOGP[1, 3], -LOGP[3, 4], -LOGP[5, 2]]
    assert float(loss) == pytest.approx(np.mean(nll), rel=1e-6)
    assert float(metrics["perplexity"]) == pytest.approx(np.exp(np.mean(nll)), rel=1e-6)
    # The values in the pad row never matter.
    changed = TABLE.copy()
    changed[0] = [-50.0, 40.0, 0.0, 1.0, 2.0, 3.0]
    loss_changed, _ = LanguageModeling()(stub(NextTokenStub, table=changed), {"tokens": tokens})
    assert float(loss_changed) == float(loss)


def test_language_modeling_without_pad_id_scores_every_position():
    tokens = np.array([[1, 3, 0]], np.int32)
    loss, _ = LanguageModeling()(stub(NextTokenStub, pad_id=None), {"tokens": tokens})
    assert float(loss) == pytest.approx(np.mean([-LOGP[1, 3], -LOGP[3, 0]]), rel=1e-6)


def test_language_modeling_loss_mask_scores_only_the_answer():
    tokens = np.array([[1, 3, 4, 5]], np.int32)
    loss_mask = np.array([[0, 0, 1, 1]], np.int32)  # score tokens 4 and 5 only
    stats = LanguageModeling().statistics(
        stub(NextTokenStub), {"tokens": tokens, "loss_mask": loss_mask}
    )
    assert float(stats.weight) == 2.0
    assert float(stats.loss) == pytest.approx(np.mean([-LOGP[3, 4], -LOGP[4, 5]]), rel=1e-6)
    # argmax after 3 is 4 (right), after 4 is 0 (wrong, the target is 5)
    assert float(stats.correct) == 1.0


def test_translation_loss_with_label_smoothing_by_hand():
    src = np.array([[3, 4, 0], [5, 0, 0]], np.int32)
    tgt = np.array([[1, 3, 4, 2], [1, 5, 2, 0]], np.int32)  # bos .. eos pad
    eps = 0.1
    loss, metrics = Translation(label_smoothing=eps)(stub(TranslatorStub), {"src": src, "tgt": tgt})
    pairs = [(1, 3), (3, 4), (4, 2), (1, 5), (5, 2)]  # decoder input -> target, pad skipped
    smoothed = [(1 - eps) * -LOGP[i, t] + eps * -LOGP[i].mean() for i, t in pairs]
    assert float(loss) == pytest.approx(np.mean(smoothed), rel=1e-6)
    right = [int(np.argmax(TABLE[i]) == t) for i, t in pairs]
    assert float(metrics["token_accuracy"]) == pytest.approx(np.mean(right))
    plain, _ = Translation()(stub(TranslatorStub), {"src": src, "tgt": tgt})
    assert float(plain) == pytest.approx(np.mean([-LOGP[i, t] for i, t in pairs]), rel=1e-6)


def test_classification_loss_and_accuracy_by_hand():
    tokens = np.array([[2, 0, 0], [3, 1, 0], [4, 4, 4]], np.int32)
    labels = np.array([0, 2, 1], np.int32)
    loss, metrics = Classification()(stub(ClassifierStub), {"tokens": tokens, "labels": labels})
    logp = log_softmax(TABLE[:, :3].astype(np.float64))
    assert float(loss) == pytest.approx(np.mean([-logp[2, 0], -logp[3, 2], -logp[4, 1]]), rel=1e-6)
    # argmaxes: row 2 -> 0 (right), row 3 -> 1 (wrong), row 4 -> 0 (wrong)
    assert float(metrics["accuracy"]) == pytest.approx(1 / 3)


def test_gpt_loss_is_unchanged_by_extra_padding(key):
    model = zoo.create("gpt-tiny", key=key)
    short = np.array([[5, 9, 12, 7, 2]], np.int32)
    padded = np.concatenate([short, np.zeros((1, 4), np.int32)], axis=1)
    task = LanguageModeling()
    loss_short, _ = task(model, {"tokens": short})
    loss_padded, _ = task(model, {"tokens": padded})
    assert float(loss_padded) == pytest.approx(float(loss_short), abs=1e-6)
    assert float(task.statistics(model, {"tokens": padded}).weight) == 4.0


def test_losses_are_float32_for_bfloat16_logits():
    table = jnp.asarray(TABLE, jnp.bfloat16)
    model = NextTokenStub(table, SimpleNamespace(pad_id=0))
    loss, _ = LanguageModeling()(model, {"tokens": np.array([[1, 3, 4]], np.int32)})
    assert loss.dtype == jnp.float32


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_losses_match_log_softmax_gather_and_argmax(smoothing):
    """The log-sum-exp form equals the textbook one, gradients included, and ties go to argmax."""
    from zoo.tasks.base import token_losses

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 5, 11)).astype(np.float32) * 3
    logits[0, 0, [2, 7]] = 50.0  # a tie for the top: argmax picks index 2
    logits[0, 1, :] = 0.0  # all equal: argmax picks index 0
    targets = rng.integers(0, 11, (4, 5)).astype(np.int32)
    targets[0, 0], targets[0, 1], targets[0, 2] = 7, 0, int(np.argmax(logits[0, 2]))

    def reference(x):
        log_probs = jax.nn.log_softmax(x, axis=-1)
        nll = -jnp.take_along_axis(log_probs, jnp.asarray(targets)[..., None], axis=-1)[..., 0]
        objective = (1 - smoothing) * nll - smoothing * jnp.mean(log_probs, axis=-1)
        return objective, nll, jnp.argmax(x, axis=-1) == targets

    ours = token_losses(jnp.asarray(logits), jnp.asarray(targets), smoothing)
    expected = reference(jnp.asarray(logits))
    np.testing.assert_allclose(ours[0], expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[1], expected[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ours[2], expected[2])
    assert not bool(ours[2][0, 0]) and bool(ours[2][0, 1]) and bool(ours[2][0, 2])
    grad_ours = jax.grad(lambda x: jnp.sum(token_losses(x, jnp.asarray(targets), smoothing)[0]))
    grad_ref = jax.grad(lambda x: jnp.sum(reference(x)[0]))
    np.testing.assert_allclose(
        grad_ours(jnp.asarray(logits)), grad_ref(jnp.asarray(logits)), rtol=1e-5, atol=1e-6
    )
