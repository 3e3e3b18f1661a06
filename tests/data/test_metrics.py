"""Accuracy, confusion matrix and BLEU against hand-computed values."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from zoo.data import accuracy, bleu, confusion_matrix


def test_accuracy():
    assert accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == 0.75
    assert accuracy(np.array([2, 2]), jnp.array([2, 2])) == 1.0
    with pytest.raises(ValueError, match="4 labels but 3 predictions"):
        accuracy([0, 1, 1, 0], [0, 1, 0])
    with pytest.raises(ValueError, match="no examples"):
        accuracy([], [])


def test_confusion_matrix_rows_are_true_classes():
    matrix = confusion_matrix([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 0, 2], num_classes=3)
    np.testing.assert_array_equal(matrix, [[1, 1, 0], [0, 1, 0], [1, 0, 2]])
    assert matrix.dtype == np.int64 and matrix.sum() == 6
    with pytest.raises(ValueError, match=r"predictions \[3\] lie outside \[0, num_classes=3\)"):
        confusion_matrix([0, 1], [0, 3], num_classes=3)
    with pytest.raises(ValueError, match="integer class ids"):
        confusion_matrix([0.5], [0], num_classes=2)


def test_bleu_by_hand():
    # unigram 5/6, bigram 4/5, trigram 3/4, 4-gram 2/3, equal lengths (no brevity penalty)
    expected = 100 * math.exp(sum(map(math.log, (5 / 6, 4 / 5, 3 / 4, 2 / 3))) / 4)
    assert bleu(["a b c d e f"], ["a b c d e g"]) == pytest.approx(expected, abs=1e-4)
    two_references = [["a cat sat", "the cat sat on the mat"]]
    assert bleu(["the cat sat on the mat"], two_references) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu(["a", "b"], ["a"])
