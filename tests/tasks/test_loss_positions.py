"""`loss_positions`: the output head on the scored positions only gives the loss, metrics and
gradients of the head on every position; a list that leaves a scored position out is refused."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.data.positions import capacity_for, largest_count, loss_positions
from zoo.nn.embedding import ids_checked_on_host
from zoo.tasks import LanguageModeling

# two packed rows of 12 tokens: conversations 1 and 2, the replies' tokens masked in
TOKENS = np.array([[1, 5, 9, 12, 7, 2, 1, 8, 4, 13, 2, 0], [1, 6, 6, 10, 11, 14, 3, 2, 0, 0, 0, 0]])
SEGMENTS = np.array([[1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]])
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0]])


def test_positions_by_hand():
    # row 0: targets t with mask[t + 1] set are 2, 3, 4, 5, 8, 9; t = 5 predicts the first token
    # of conversation 2 from conversation 1: not scored in a packed row
    assert largest_count(MASK, SEGMENTS) == 5
    assert loss_positions(MASK, 8, SEGMENTS).tolist() == [
        [2, 3, 4, 8, 9, -1, -1, -1],
        [4, 5, 6, -1, -1, -1, -1, -1],
    ]
    assert loss_positions(MASK, 8)[0].tolist()[:6] == [2, 3, 4, 5, 8, 9]  # unpacked rule
    assert (capacity_for(5, 16), capacity_for(5, 15), capacity_for(9, 64)) == (8, None, 16)
    with pytest.raises(ValueError, match="scores 5 targets, more than the capacity 4"):
        loss_positions(MASK, 4, SEGMENTS)


def loss_and_grads(model, batch):
    task = LanguageModeling()

    def loss(model):
        stats = task.statistics(model, batch)
        return stats.loss_sum, stats

    (_, stats), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
    return stats, grads


def test_the_head_on_listed_positions_gives_the_same_loss_and_gradients(key):
    model = zoo.create("gpt-tiny", key=key)
    batch = {"tokens": TOKENS, "loss_mask": MASK, "segments": SEGMENTS}
    listed = batch | {"loss_positions": loss_positions(MASK, 8, SEGMENTS)}
    LanguageModeling().check_batch(listed, model)
    full, full_grads = loss_and_grads(model, batch)
    narrow, narrow_grads = loss_and_grads(model, listed)
    assert float(narrow.weight) == float(full.weight) == 8.0
    for name in ("loss_sum", "nll_sum", "correct"):
        np.testing.assert_allclose(getattr(narrow, name), getattr(full, name), rtol=1e-6)
    flat_full = jax.tree_util.tree_leaves(eqx.filter(full_grads, eqx.is_inexact_array))
    flat_narrow = jax.tree_util.tree_leaves(eqx.filter(narrow_grads, eqx.is_inexact_array))
    for a, b in zip(flat_full, flat_narrow, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_a_list_without_a_scored_position_is_refused_on_the_host_and_the_device(key):
    model = zoo.create("gpt-tiny", key=key)
    positions = loss_positions(MASK, 8, SEGMENTS)
    positions[1, 2] = -1  # target 6 of row 1 is scored
    batch = {"tokens": TOKENS, "loss_mask": MASK, "segments": SEGMENTS, "loss_positions": positions}
    with pytest.raises(ValueError, match="leaves out target position 6 of row 1, which the loss"):
        LanguageModeling().check_batch(batch, model)
    past = batch | {"loss_positions": np.full((2, 8), 11)}
    with pytest.raises(ValueError, match="holds 11, past the last target position 10"):
        LanguageModeling().check_batch(past, model)
    with pytest.raises(Exception, match="loss_positions leaves out a target position"):
        jax.block_until_ready(LanguageModeling().statistics(model, batch).loss_sum)
    with ids_checked_on_host():  # the trainer checked it on the host: no device check
        stats = LanguageModeling().statistics(model, batch)
    assert float(stats.weight) == 7.0
    assert jnp.isfinite(stats.loss_sum)
