"""The floor does zoo's work: on the same weights its losses equal zoo's tasks' in float32, a
train step moves the weights as zoo's does, and its greedy decoding picks zoo's tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.bench import floor
from zoo.bench.run_zoo import make_greedy_decode
from zoo.tasks import Classification, LanguageModeling
from zoo.train import adamw
from zoo.train.optim import init_optimizer
from zoo.train.step import make_train_step

SHAPE = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_positions=24, dropout=0.0,
             attention_dropout=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def gpt2():
    no_specials = dict(bos_id=None, eos_id=None, stop_ids=())
    return zoo.create("gpt2", key=jax.random.key(0), vocab_size=97, **no_specials, **SHAPE)


@pytest.fixture(scope="module")
def bert():
    return zoo.create("bert-base", key=jax.random.key(1), vocab_size=97, **SHAPE)


def tokens(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 97, shape), jnp.int32)


def test_the_floor_covers_gpt2s_and_berts_parts_at_any_size():
    def covers(name):
        return floor.covers(zoo.presets.get(name).flavor, zoo.presets.get(name).config)

    for name in ("gpt2", "gpt2-xl", "gpt-tiny", "bert-base", "bert-large"):
        assert covers(name) is None, name
    assert "layers.block.attention.rope" in covers("llama-tiny")
    assert "differs at embedder.position_offset" in covers("roberta-base")
    assert "head.pooling" in covers("classifier-tiny")  # mean pooling, no pooler
    assert "mixture of experts" in covers("mixtral-tiny")
    assert "not a translator" in covers("translator-tiny")


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unroll"])
def test_gpt2_loss_equals_language_modelings(gpt2, scan):
    batch = {"tokens": tokens((3, 17))}
    expected, _ = LanguageModeling()(gpt2, batch)
    model = floor.Floor.of(gpt2.config)
    model = floor.Floor(**{**vars(model), "scan": scan})
    loss = jax.jit(model.gpt2_loss)(floor.floor_params(gpt2), batch)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_bert_loss_equals_classifications(bert):
    batch = {"tokens": tokens((4, 12), seed=1), "labels": jnp.asarray([0, 1, 1, 0])}
    expected, _ = Classification()(bert, batch)
    loss = floor.Floor.of(bert.config).bert_loss(floor.floor_params(bert), batch)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_a_train_step_moves_the_weights_as_zoos_does(gpt2):
    batch = {"tokens": tokens((2, 13), seed=2)}
    params = floor.floor_params(gpt2)
    step, init = floor.make_train_step(floor.Floor.of(gpt2.config).gpt2_loss, jnp.float32, 1e-2)
    copy = jax.tree_util.tree_map(jnp.copy, params)
    new_params, _, loss = step(copy, init(copy), batch)

    optimizer = adamw(1e-2)
    zoo_step = make_train_step(LanguageModeling(), optimizer)
    model = jax.tree_util.tree_map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, gpt2)
    state = init_optimizer(optimizer, model)
    moved, _, output = zoo_step(model, state, batch, jax.random.key(0), 0)
    np.testing.assert_allclose(loss, output.stats.loss, rtol=1e-5)
    expected = floor.floor_params(moved)
    for name, value in jax.tree_util.tree_leaves_with_path(new_params):
        if name[-1].key == "key_b":  # a key bias adds one constant to a query's scores: its
            continue  # true gradient is 0, and Adam scales either side's rounding noise to lr
        want = _at(expected, name)
        np.testing.assert_allclose(value, want, atol=2e-6, err_msg=jax.tree_util.keystr(name))
    assert not np.allclose(new_params["layers"]["query_w"], params["layers"]["query_w"])


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_greedy_decoding_picks_zoos_tokens(gpt2):
    prompts = tokens((2, 5), seed=3)
    expected = make_greedy_decode(5, 6, "fp32")(gpt2, prompts)
    decoded = jax.jit(floor.Floor.of(gpt2.config).greedy_decode, static_argnums=2)(
        floor.floor_params(gpt2), prompts, 6
    )
    np.testing.assert_array_equal(decoded, expected)
