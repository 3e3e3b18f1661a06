"""Batches and models that do not fit a task get a clear error from host-side checks."""

from __future__ import annotations

import numpy as np
import pytest

import zoo
from zoo.tasks import Classification, LanguageModeling, Translation, for_flavor


@pytest.fixture(scope="module")
def models():
    # Shapes only: the checks read the config and the class, never the weights.
    return {
        "gpt": zoo.presets.abstract("gpt-tiny"),
        "classifier": zoo.presets.abstract("classifier-tiny"),
        "translator": zoo.presets.abstract("translator-tiny"),
    }


def test_task_for_the_wrong_flavor_names_the_right_task(models):
    with pytest.raises(
        TypeError, match=r"Translation trains a zoo.Translator.*got GPT.*LanguageModeling"
    ):
        Translation().check_model(models["gpt"])
    with pytest.raises(TypeError, match=r"Classification trains a zoo\.Classifier"):
        Classification().check_model(models["translator"])
    with pytest.raises(TypeError, match="got str"):
        LanguageModeling().check_model("gpt")
    LanguageModeling().check_model(models["gpt"])


def test_missing_key_says_what_a_batch_needs(models):
    with pytest.raises(
        ValueError, match=r"missing \['labels'\].*tokens \[batch, seq\], labels \[batch\]"
    ):
        Classification().check_batch({"tokens": np.ones((2, 4), np.int32)}, models["classifier"])


def test_wrong_rank_and_dtype(models):
    with pytest.raises(
        ValueError, match=r"batch\['tokens'\] must be \[batch, seq\] \(rank 2\), got shape \(4,\)"
    ):
        LanguageModeling().check_batch({"tokens": np.ones(4, np.int32)}, models["gpt"])
    with pytest.raises(ValueError, match="must hold integers, got dtype float32"):
        LanguageModeling().check_batch({"tokens": np.ones((2, 4), np.float32)}, models["gpt"])


def test_batch_sizes_must_agree(models):
    batch = {"src": np.ones((2, 4), np.int32), "tgt": np.ones((3, 4), np.int32)}
    with pytest.raises(ValueError, match="disagree on the batch size"):
        Translation().check_batch(batch, models["translator"])


def test_labels_outside_num_classes(models):
    batch = {"tokens": np.ones((3, 4), np.int32), "labels": np.array([0, 1, 2], np.int32)}
    with pytest.raises(ValueError, match=r"labels in \[0, 2\].*num_classes=2.*num_classes=3"):
        Classification().check_batch(batch, models["classifier"])


def test_token_ids_outside_the_vocabulary(models):
    tokens = np.array([[1, 5, 64]], np.int32)
    with pytest.raises(ValueError, match=r"ids in \[1, 64\].*vocabulary is \[0, 64\)"):
        LanguageModeling().check_batch({"tokens": tokens}, models["gpt"])
    batch = {"src": np.array([[3, -1]], np.int32), "tgt": np.array([[1, 3, 2]], np.int32)}
    with pytest.raises(ValueError, match=r"batch\['src'\] holds ids in \[-1, 3\]"):
        Translation().check_batch(batch, models["translator"])


def test_sequences_longer_than_the_model(models):
    too_long = np.ones((1, 130), np.int32)  # gpt-tiny reads 129 - 1 = 128 positions at most
    with pytest.raises(ValueError, match="max_positions=128"):
        LanguageModeling().check_batch({"tokens": too_long}, models["gpt"])
    LanguageModeling().check_batch({"tokens": np.ones((1, 129), np.int32)}, models["gpt"])


def test_language_modeling_needs_two_positions_and_a_matching_loss_mask(models):
    with pytest.raises(ValueError, match="at least 2"):
        LanguageModeling().check_batch({"tokens": np.ones((2, 1), np.int32)}, models["gpt"])
    batch = {"tokens": np.ones((2, 4), np.int32), "loss_mask": np.ones((2, 3), np.int32)}
    with pytest.raises(ValueError, match=r"loss_mask'\] must have the shape"):
        LanguageModeling().check_batch(batch, models["gpt"])


def test_for_flavor_and_label_smoothing_range():
    assert isinstance(for_flavor("gpt"), LanguageModeling)
    assert for_flavor("translator", label_smoothing=0.1).label_smoothing == 0.1
    with pytest.raises(ValueError, match="unknown flavor 'bert'"):
        for_flavor("bert")
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\)"):
        Translation(label_smoothing=1.0)
