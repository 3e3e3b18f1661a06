"""Freezing: frozen parameters stay bit-identical through optimizer steps, the rest move."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.train.freeze import check_freeze, freeze, parse_freeze


def _steps(model, optimizer, steps=3):
    tokens = jnp.array([[1, 5, 9, 4, 0, 0], [1, 7, 7, 3, 8, 2]], jnp.int32)
    labels = jnp.array([0, 1], jnp.int32)

    def loss(model):
        logits = jax.vmap(model)(tokens)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
        return -jnp.mean(picked)

    @eqx.filter_jit
    def step(model, state):
        with jax.numpy_dtype_promotion("standard"):  # optax's bias correction: float ** int
            grads = eqx.filter_grad(loss)(model)
            params = eqx.filter(model, eqx.is_array)
            updates, state = optimizer.update(grads, state, params)
        return eqx.apply_updates(model, updates), state

    state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    for _ in range(steps):
        model, state = step(model, state)
    return model


def test_parse_freeze():
    groups = parse_freeze("embeddings, layers:0-5,decoder:2,head")
    assert [(g.name, g.first, g.last) for g in groups] == [
        ("embeddings", None, None),
        ("layers", 0, 5),
        ("decoder", 2, 2),
        ("head", None, None),
    ]
    with pytest.raises(ValueError, match="layers:A-B"):
        parse_freeze("layers:first")
    with pytest.raises(ValueError, match="block ranges go with"):
        parse_freeze("head:0-1")


def test_frozen_parameters_are_bit_identical(key):
    model = zoo.create("classifier-tiny", key=key, num_layers=3)
    optimizer = freeze(zoo.train.adamw(1e-2, weight_decay=0.1), "embeddings,layers:0-1")
    trained = _steps(model, optimizer)
    before, after = model.encoder.blocks, trained.encoder.blocks
    # embeddings: untouched; blocks 0 and 1 of the stacked layers: untouched; block 2: trained
    np.testing.assert_array_equal(trained.embedder.token_weight, model.embedder.token_weight)
    np.testing.assert_array_equal(trained.embedder.position_weight, model.embedder.position_weight)
    weight = lambda blocks: np.asarray(blocks.feed_forward.hidden.weight)  # noqa: E731
    np.testing.assert_array_equal(weight(after)[:2], weight(before)[:2])
    assert np.abs(weight(after)[2] - weight(before)[2]).max() > 1e-4
    assert np.abs(np.asarray(trained.head.weight) - np.asarray(model.head.weight)).max() > 1e-4


def test_unfrozen_training_is_unchanged_by_an_empty_match(key):
    model = zoo.create("classifier-tiny", key=key)
    plain = _steps(model, zoo.train.adamw(1e-2))
    frozen_head = _steps(model, freeze(zoo.train.adamw(1e-2), "head"))
    np.testing.assert_array_equal(frozen_head.head.weight, model.head.weight)
    # freezing the head leaves the head's gradient flowing into nothing else: the encoder moves
    assert np.abs(np.asarray(plain.final_norm.weight) - 1.0).max() > 0


def test_check_freeze_counts_and_errors(key):
    model = zoo.create("classifier-tiny", key=key)
    counts = check_freeze(model, parse_freeze("embeddings,layers:1"))
    assert counts["embeddings"] == 64 * 64 + 128 * 64
    per_block = sum(
        leaf.size // 2
        for leaf in jax.tree_util.tree_leaves(eqx.filter(model.encoder.blocks, eqx.is_array))
    )
    assert counts["layers:1-1"] == per_block
    with pytest.raises(ValueError, match="has only 2 blocks"):
        check_freeze(model, parse_freeze("layers:0-5"))
    with pytest.raises(ValueError, match="matches no parameter.*embedder"):
        check_freeze(model, parse_freeze("decoderx"))


def test_layer_ranges_freeze_real_layers_of_a_stack_with_several_kinds(key):
    # qwen3-moe-mixed-tiny: experts on layer 1 only, so the dense group's rows are layers 0, 2, 3
    model = zoo.create("qwen3-moe-mixed-tiny", key=key)
    dense, sparse = model.layers.groups
    assert (model.layers.group_layers(0), model.layers.group_layers(1)) == ((0, 2, 3), (1,))
    optimizer = freeze(zoo.train.adamw(1e-2), "layers:1-2")

    tokens = jnp.array([[1, 5, 9, 4, 3, 2], [1, 7, 7, 3, 8, 2]], jnp.int32)

    @eqx.filter_jit
    def step(model, state):
        def loss(model):
            return jnp.mean(jax.vmap(model)(tokens) ** 2)

        with jax.numpy_dtype_promotion("standard"):
            grads = eqx.filter_grad(loss)(model)
            updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state

    state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    trained, _ = step(model, state)
    new_dense, new_sparse = trained.layers.groups
    query = lambda blocks: np.asarray(blocks.self_attention.query_proj.weight)  # noqa: E731
    moved = np.abs(query(new_dense) - query(dense)).max(axis=(1, 2))
    # dense rows are layers 0, 2, 3: layer 2 (row 1) frozen, 0 and 3 trained
    assert moved[1] == 0 and moved[0] > 1e-4 and moved[2] > 1e-4
    # the sparse group's only row is layer 1: frozen
    np.testing.assert_array_equal(query(new_sparse), query(sparse))
    counts = check_freeze(model, parse_freeze("layers:1-2"))
    per_layer = lambda blocks: sum(  # noqa: E731
        leaf.size // leaf.shape[0]
        for leaf in jax.tree_util.tree_leaves(eqx.filter(blocks, eqx.is_array))
    )
    assert counts["layers:1-2"] == per_layer(dense) + per_layer(sparse)
    with pytest.raises(ValueError, match="has only 4 blocks"):
        check_freeze(model, parse_freeze("layers:2-4"))
