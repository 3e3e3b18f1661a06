"""Packed documents: one row of several documents gives what each document gives alone."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.common import segment_positions

DOCUMENTS = [[5, 9, 12, 7, 3], [8, 4, 11], [6, 13, 10, 14]]
PAD = 0


def packed_row(width: int = 14):
    """The documents back to back, then padding (its own segment id): tokens and segments."""
    tokens = np.full(width, PAD, np.int32)
    segments = np.full(width, 99, np.int32)
    start = 0
    for number, document in enumerate(DOCUMENTS):
        tokens[start : start + len(document)] = document
        segments[start : start + len(document)] = number
        start += len(document)
    return tokens, segments


def test_segment_positions_by_hand():
    documents, positions = segment_positions(jnp.array([7, 7, 7, 2, 2, 7]), 6)
    assert positions.tolist() == [0, 1, 2, 0, 1, 0]
    assert documents.tolist() == [1, 1, 1, 2, 2, 3]  # the last 7 is a document of its own
    with pytest.raises(ValueError, match="one document id per token"):
        segment_positions(jnp.array([1, 1]), 3)


@pytest.mark.parametrize(
    "preset, overrides",
    [("gpt-tiny", {}), ("llama-tiny", {}), ("llama-tiny", {"attention.window": 2})],
    ids=["learned-positions", "rotary", "rotary-window"],
)
def test_each_packed_document_sees_only_itself_from_position_zero(preset, overrides):
    model = eqx.nn.inference_mode(zoo.create(preset, key=jax.random.key(0), **overrides))
    tokens, segments = packed_row()
    packed = model(jnp.asarray(tokens), segments=jnp.asarray(segments))
    start = 0
    for document in DOCUMENTS:
        alone = model(jnp.asarray(document, jnp.int32))
        np.testing.assert_allclose(
            packed[start : start + len(document)], alone, rtol=1e-5, atol=1e-5
        )
        start += len(document)


def test_a_packed_batch_has_the_loss_and_gradients_of_its_documents_unpacked():
    model = zoo.create("llama-tiny", key=jax.random.key(0), dropout=0.0, attention_dropout=0.0)
    assert model.config.pad_id is not None
    task = zoo.tasks.LanguageModeling()
    tokens, segments = packed_row()
    packed = {"tokens": tokens[None], "segments": segments[None]}
    width = max(map(len, DOCUMENTS))
    unpacked = {
        "tokens": np.array([d + [PAD] * (width - len(d)) for d in DOCUMENTS], np.int32),
    }

    def loss_sum(model, batch):
        stats = task.statistics(model, batch)
        return stats.loss_sum, stats

    (_, packed_stats), packed_grads = eqx.filter_value_and_grad(loss_sum, has_aux=True)(
        model, packed
    )
    (_, stats), grads = eqx.filter_value_and_grad(loss_sum, has_aux=True)(model, unpacked)
    # every next-token pair inside a document, none across documents: 4 + 2 + 3
    assert float(packed_stats.weight) == float(stats.weight) == 9
    np.testing.assert_allclose(packed_stats.loss_sum, stats.loss_sum, rtol=1e-5)
    np.testing.assert_allclose(packed_stats.correct, stats.correct)
    for a, b in zip(jax.tree_util.tree_leaves(packed_grads), jax.tree_util.tree_leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_segments_must_match_the_tokens():
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    task = zoo.tasks.LanguageModeling()
    with pytest.raises(ValueError, match=r"batch\['segments'\] must have the shape"):
        task.check_batch(
            {"tokens": np.ones((2, 5), np.int32), "segments": np.ones((2, 4), np.int32)}, model
        )
