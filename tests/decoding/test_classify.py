"""Batch classification: probabilities equal the softmax of the per-example logits."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo

BATCH = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


@pytest.fixture(scope="module")
def classifier():
    return zoo.create("classifier-tiny", key=jax.random.key(3), num_classes=3)


def test_probabilities_are_the_softmax_of_each_example(classifier):
    probs = zoo.classify(classifier, BATCH)
    assert probs.shape == (3, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    forward = eqx.filter_jit(lambda model, tokens: jax.nn.softmax(model(tokens)))
    for row, tokens in enumerate(BATCH):
        # each sequence alone, unpadded: the padding of the batch must not change its answer
        np.testing.assert_allclose(probs[row], forward(classifier, jnp.asarray(tokens)), atol=1e-5)


def test_an_explicit_mask_overrides_padding(classifier):
    padded = np.array([[5, 6, 7, 8], [9, 10, 0, 0], [11, 12, 13, 0]], np.int32)
    mask = padded != 0
    np.testing.assert_allclose(
        zoo.classify(classifier, padded, mask), zoo.classify(classifier, padded), atol=1e-6
    )


def test_classify_checks_its_input(classifier, gpt):
    with pytest.raises(ValueError, match="empty"):
        zoo.classify(classifier, [[5, 6], [0, 0]])
    with pytest.raises(TypeError, match="Classifier"):
        zoo.classify(gpt, BATCH)
