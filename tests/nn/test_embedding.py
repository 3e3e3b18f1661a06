import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import (
    Embedder,
    EmbedderSettings,
    Init,
    NormSettings,
    check_token_ids,
    sinusoidal_positions,
)


def test_sinusoidal_values_at_known_positions():
    pe = np.asarray(sinusoidal_positions(jnp.arange(3), 4))
    # dim 4: frequencies 1 and 1/100 ; PE[p] = [sin p, cos p, sin p/100, cos p/100]
    np.testing.assert_allclose(pe[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(
        pe[2], [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)], atol=1e-6
    )
    concatenated = np.asarray(sinusoidal_positions(jnp.arange(3), 4, layout="concatenated"))
    np.testing.assert_allclose(
        concatenated[2], [math.sin(2), math.sin(0.02), math.cos(2), math.cos(0.02)], atol=1e-6
    )


def test_sinusoidal_matches_paper_formula_for_wide_dim():
    d, p = 512, 37
    pe = np.asarray(sinusoidal_positions(jnp.array([p]), d))[0]
    i = np.arange(d // 2)
    np.testing.assert_allclose(pe[0::2], np.sin(p / 10000 ** (2 * i / d)), atol=1e-4)
    np.testing.assert_allclose(pe[1::2], np.cos(p / 10000 ** (2 * i / d)), atol=1e-4)


def embedder(d_model: int, key, *, own_tokens: bool = True, init=None, **fields) -> Embedder:
    """An embedder of 10 tokens and 8 positions with these settings."""
    return Embedder(
        10, d_model, 8, EmbedderSettings(**fields), own_tokens=own_tokens, init=init, key=key
    )


def test_scaled_tokens_plus_learned_positions_plus_types(key):
    emb = embedder(4, key, scale=True, type_vocab_size=2)
    tokens, types = jnp.array([3, 5]), jnp.array([0, 1])
    out = emb(tokens, jnp.arange(2), types)
    expected = (
        np.asarray(emb.token_weight)[[3, 5]] * 2.0  # sqrt(4)
        + np.asarray(emb.position_weight)[[0, 1]]
        + np.asarray(emb.token_type_weight)[[0, 1]]
    )
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_sinusoidal_embedder_has_no_position_table(key):
    emb = embedder(4, key, positions="sinusoidal")
    assert emb.position_weight is None
    out = emb(jnp.array([1]), jnp.array([2]))
    expected = (
        np.asarray(emb.token_weight)[1] + np.asarray(sinusoidal_positions(jnp.array([2]), 4))[0]
    )
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


def test_embedding_norm_normalises(key):
    emb = embedder(16, key, norm=NormSettings(eps=1e-12))
    out = np.asarray(emb(jnp.array([1, 2, 3]), jnp.arange(3)))
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-3)


def test_tables_are_drawn_as_init_says(key):
    emb = embedder(16, key, type_vocab_size=2, init=Init(0.5, jnp.bfloat16))
    tables = (emb.token_weight, emb.position_weight, emb.token_type_weight)
    assert all(table.dtype == jnp.bfloat16 for table in tables)
    assert 0.4 < float(jnp.std(emb.token_weight.astype(jnp.float32))) < 0.6
    shared = embedder(16, key, own_tokens=False)
    assert shared.token_weight is None
    with pytest.raises(ValueError, match="pass token_weight"):
        shared(jnp.array([1]), jnp.array([0]))


@pytest.mark.parametrize("bad", [[0, 10], [-1, 2]])
def test_token_ids_outside_vocab_raise_eagerly_and_under_jit(bad):
    with pytest.raises(Exception, match=r"outside \[0, 10\)"):
        check_token_ids(jnp.array(bad), 10)
    with pytest.raises(Exception, match=r"outside \[0, 10\)"):
        jax.block_until_ready(eqx.filter_jit(check_token_ids)(jnp.array(bad), 10))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(positions="alibi"), "positions must be one of"),
        (dict(positions="rotary"), r"rotary positions are the attention's `rope`"),
        (dict(sinusoid_layout="split"), "sinusoid_layout must be one of"),
        (dict(type_vocab_size=-1), "type_vocab_size must be an integer >= 0, got -1"),
        (dict(dropout=1.0), r"embedding dropout must be in \[0, 1\)"),
    ],
)
def test_bad_embedder_settings_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        EmbedderSettings(**fields)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((0, 4, 8), "vocab_size must be a positive integer, got 0"),
        ((10, 4, -1), "max_positions must be a positive integer, got -1"),
    ],
)
def test_bad_embedder_sizes_name_the_size(sizes, message, key):
    with pytest.raises(ValueError, match=message):
        Embedder(*sizes, key=key)
