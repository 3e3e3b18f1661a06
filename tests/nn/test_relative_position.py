"""T5's relative position buckets and bias, and the additive score bias of the one attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import (
    AttentionSettings,
    KernelOptions,
    MultiHeadAttention,
    RelativePositionBias,
    relative_position_buckets,
)
from zoo.nn.attention import attention_weights, dot_product_attention

# key_position - query_position -> bucket, worked out by hand from T5's rule with 32 buckets and
# max_distance 128. Bidirectional: 16 buckets per direction, 8 exact; beyond,
# 8 + floor(log(d / 8) / log(128 / 8) * 8), at most 15 (+16 for keys after the query).
BIDIRECTIONAL = {
    0: 0,
    -1: 1,
    1: 17,
    -7: 7,
    -8: 8,  # 8 + floor(log(1) / log(16) * 8)
    -16: 10,  # 8 + floor(0.25 * 8)
    -20: 10,  # 8 + floor(2.64)
    -32: 12,  # 8 + floor(0.5 * 8)
    -64: 14,
    -127: 15,
    -128: 15,  # 8 + 8 = 16, clipped to 15
    -1000: 15,
    1000: 31,
    8: 24,
    64: 30,
}
# Causal: 32 buckets, 16 exact; beyond, 16 + floor(log(d / 16) / log(128 / 16) * 16), at most
# 31. Keys after the query share bucket 0 with the query itself.
CAUSAL = {5: 0, 0: 0, -5: 5, -15: 15, -16: 16, -32: 21, -64: 26, -127: 31, -128: 31, -1000: 31}


@pytest.mark.parametrize(("bidirectional", "cases"), [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_buckets_by_hand(bidirectional, cases):
    relative = jnp.array(list(cases), jnp.int32)
    buckets = relative_position_buckets(
        relative, bidirectional=bidirectional, num_buckets=32, max_distance=128
    )
    assert dict(zip(cases, np.asarray(buckets).tolist(), strict=True)) == cases


def test_small_tables_by_hand():
    # 8 buckets, max_distance 8, bidirectional: 4 per direction, 2 exact, then log buckets
    relative = jnp.arange(-9, 10)
    buckets = relative_position_buckets(relative, bidirectional=True, num_buckets=8, max_distance=8)
    # d=2, 3: 2 + floor(log(d/2) / log(4) * 2) = 2; d=4: 2 + floor(0.5 * 2) = 3; more: 3
    expected = [3] * 6 + [2, 2, 1, 0, 5, 6, 6] + [7] * 6
    assert np.asarray(buckets).tolist() == expected


def test_bias_table_lookup_and_layout(key):
    bias = RelativePositionBias(3, bidirectional=True, num_buckets=32, max_distance=128, key=key)
    table = np.asarray(bias.weight)
    out = np.asarray(bias(jnp.arange(4), jnp.arange(5)))
    assert out.shape == (3, 4, 5)
    # query 2, key 0: relative -2 -> bucket 2; query 0, key 3: relative 3 -> bucket 19
    np.testing.assert_array_equal(out[:, 2, 0], table[2])
    np.testing.assert_array_equal(out[:, 0, 3], table[19])


def test_cached_queries_use_their_absolute_position(key):
    """One decoding step at position 3 gets row 3 of the full causal bias."""
    bias = RelativePositionBias(2, bidirectional=False, num_buckets=8, max_distance=16, key=key)
    full = bias(jnp.arange(6), jnp.arange(6))
    index = jnp.array(3)
    step = bias(index + jnp.arange(1), jnp.arange(6))
    np.testing.assert_array_equal(step[:, 0], full[:, 3])


def test_bad_bucket_settings_are_refused(key):
    with pytest.raises(ValueError, match="num_buckets=2 is too few"):
        RelativePositionBias(2, bidirectional=True, num_buckets=2, key=key)
    with pytest.raises(ValueError, match="max_distance=4 must exceed"):
        RelativePositionBias(2, bidirectional=False, num_buckets=8, max_distance=4, key=key)


def numpy_weights(query, key, bias, scale):
    scores = np.einsum("qhd,khd->hqk", query, key) * (1 / np.sqrt(query.shape[-1]) if scale else 1)
    scores = scores + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


@pytest.mark.parametrize("scale", [True, False])
def test_score_bias_and_unscaled_scores_match_numpy(scale):
    keys = jax.random.split(jax.random.key(3), 3)
    query = jax.random.normal(keys[0], (4, 2, 8))
    key = jax.random.normal(keys[1], (5, 2, 8))
    bias = jax.random.normal(keys[2], (2, 4, 5))
    weights = attention_weights(query, key, score_bias=bias, scale=scale)
    expected = numpy_weights(*map(np.asarray, (query, key, bias)), scale)
    np.testing.assert_allclose(weights, expected, atol=1e-6)


def test_fused_path_adds_the_bias_too():
    keys = jax.random.split(jax.random.key(4), 4)
    query = jax.random.normal(keys[0], (4, 4, 8))
    key = jax.random.normal(keys[1], (6, 2, 8))  # grouped-query attention
    value = jax.random.normal(keys[2], (6, 2, 8))
    bias = jax.random.normal(keys[3], (4, 4, 6))
    mask = jnp.array([True] * 5 + [False])[None, :].repeat(4, axis=0)
    unscaled = KernelOptions(scale=False)
    explicit, _ = dot_product_attention(
        query, key, value, mask, score_bias=bias, return_weights=True, options=unscaled
    )
    fused, _ = dot_product_attention(
        query, key, value, mask, score_bias=bias, options=unscaled._replace(implementation="xla")
    )
    np.testing.assert_allclose(fused, explicit, atol=1e-5)


def test_attention_without_bias_is_unchanged(key):
    mha = MultiHeadAttention(8, AttentionSettings(num_heads=2), key=key)
    x = jax.random.normal(jax.random.key(1), (3, 8))
    q = mha.project_query(x)
    k, v = mha.project_key_value(x)
    plain, _ = mha.attend(q, k, v)
    zero, _ = mha.attend(q, k, v, score_bias=jnp.zeros((2, 3, 3)))
    np.testing.assert_allclose(plain, zero, atol=1e-7)
    assert mha.scale_scores
