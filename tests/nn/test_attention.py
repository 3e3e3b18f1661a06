import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import KVCache, MultiHeadAttention, attention_mask, attention_weights
from zoo.nn.attention import dot_product_attention


def numpy_attention(mha, x, context, mask):
    """Reference multi-head attention written with numpy only."""

    def proj(linear, inputs):
        return inputs @ np.asarray(linear.weight).T + np.asarray(linear.bias)

    heads, hd = mha.num_heads, mha.head_dim
    q = proj(mha.query_proj, x).reshape(len(x), heads, hd)
    k = proj(mha.key_proj, context).reshape(len(context), heads, hd)
    v = proj(mha.value_proj, context).reshape(len(context), heads, hd)
    out = np.zeros((len(x), heads, hd))
    for h in range(heads):
        scores = q[:, h] @ k[:, h].T / np.sqrt(hd)
        scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[:, h] = weights @ v[:, h]
    return proj(mha.output_proj, out.reshape(len(x), heads * hd))


def random_mha(key, d_model=12, heads=3):
    mha = MultiHeadAttention(d_model, heads, key=key, init_std=0.3)
    # non-zero biases, so a missing bias would show
    params, static = eqx.partition(mha, eqx.is_array)
    params = jax.tree_util.tree_map(lambda a: a + 0.1 if a.ndim == 1 else a, params)
    return eqx.combine(params, static)


@pytest.mark.parametrize("weights_path", [False, True])
def test_self_attention_matches_numpy(key, weights_path):
    mha = random_mha(key)
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, 12)))
    mask = np.asarray(attention_mask(5, jnp.array([True, True, True, True, False]), causal=True))
    q = mha.project_query(jnp.asarray(x))
    k, v = mha.project_key_value(jnp.asarray(x))
    out, _ = mha.attend(q, k, v, jnp.asarray(mask), return_weights=weights_path)
    np.testing.assert_allclose(out, numpy_attention(mha, x, x, mask), atol=1e-5)


def test_cross_attention_matches_numpy(key):
    mha = random_mha(key)
    x = np.asarray(jax.random.normal(jax.random.key(1), (4, 12)))
    context = np.asarray(jax.random.normal(jax.random.key(2), (6, 12)))
    mask = np.asarray(attention_mask(4, jnp.array([True] * 4 + [False] * 2)))
    out = mha(jnp.asarray(x), jnp.asarray(context), mask=jnp.asarray(mask))
    np.testing.assert_allclose(out, numpy_attention(mha, x, context, mask), atol=1e-5)


def test_masks_by_hand():
    valid = jnp.array([True, True, False])
    expected_causal_pad = np.array(
        [[1, 0, 0], [1, 1, 0], [1, 1, 0]],
        dtype=bool,
    )
    np.testing.assert_array_equal(attention_mask(3, valid, causal=True), expected_causal_pad)
    np.testing.assert_array_equal(attention_mask(2, valid), np.array([[1, 1, 0], [1, 1, 0]], bool))
    # a query offset of 2 (two positions cached) on a 4-slot cache
    offset = attention_mask(2, None, num_keys=4, causal=True, query_offset=2)
    np.testing.assert_array_equal(offset, np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool))
    assert attention_mask(3) is None


def test_weights_rows_sum_to_one_over_unmasked_keys(key):
    q = jax.random.normal(key, (4, 2, 8))
    k = jax.random.normal(jax.random.key(3), (4, 2, 8))
    mask = attention_mask(4, jnp.array([True, True, True, False]), causal=True)
    weights = attention_weights(q, k, mask)
    np.testing.assert_allclose(weights.sum(-1), np.ones((2, 4)), atol=1e-6)
    assert float(jnp.abs(jnp.where(mask[None], 0.0, weights)).max()) == 0.0


@pytest.mark.parametrize("return_weights", [False, True])
def test_fully_masked_rows_are_finite_in_value_and_gradient(key, return_weights):
    mha = random_mha(key)
    x = jax.random.normal(jax.random.key(1), (3, 12))
    mask = jnp.zeros((3, 3), bool)  # every key masked for every query

    def loss(module, inputs):
        q = module.project_query(inputs)
        k, v = module.project_key_value(inputs)
        out, _ = module.attend(q, k, v, mask, return_weights=return_weights)
        return jnp.sum(out**2), out

    (value, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(mha, x)
    assert np.isfinite(float(value))
    # no key to attend to: the attention output is zero, only the output bias remains
    np.testing.assert_allclose(out, np.broadcast_to(np.asarray(mha.output_proj.bias), (3, 12)))
    leaves = jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)


def test_fused_and_explicit_paths_agree(key):
    q = jax.random.normal(key, (5, 2, 4))
    k = jax.random.normal(jax.random.key(1), (7, 2, 4))
    v = jax.random.normal(jax.random.key(2), (7, 2, 4))
    mask = attention_mask(5, jnp.array([True] * 5 + [False] * 2))
    fused, none = dot_product_attention(q, k, v, mask, implementation="xla")
    explicit, weights = dot_product_attention(q, k, v, mask, return_weights=True)
    assert none is None and weights.shape == (2, 5, 7)
    np.testing.assert_allclose(fused, explicit, atol=1e-5)


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_causal_flag_equals_the_causal_mask_in_value_and_gradient(key, implementation):
    """`causal=True` is the causal mask; on the fused path it becomes `is_causal`."""
    q = jax.random.normal(key, (6, 4, 8))
    k, v = (jax.random.normal(jax.random.key(seed), (6, 2, 8)) for seed in (1, 2))
    ordered = attention_mask(6, causal=True, num_keys=6)
    padded = attention_mask(6, jnp.array([True] * 4 + [False] * 2), causal=True, num_keys=6)
    padding = attention_mask(6, jnp.array([True] * 4 + [False] * 2))

    def total(q, k, v, mask, causal):
        out, _ = dot_product_attention(q, k, v, mask, implementation=implementation, causal=causal)
        return jnp.sum(out * jnp.arange(8.0)[None, None, :]), out

    for mask, flag_mask in ((ordered, None), (padded, padding)):
        (_, expected), grads = jax.value_and_grad(total, (0, 1, 2), has_aux=True)(
            q, k, v, mask, False
        )
        (_, found), flag_grads = jax.value_and_grad(total, (0, 1, 2), has_aux=True)(
            q, k, v, flag_mask, True
        )
        np.testing.assert_allclose(found, expected, atol=1e-6)
        for ours, theirs in zip(flag_grads, grads):
            np.testing.assert_allclose(ours, theirs, atol=1e-6)
    # the first query sees only the first key: its output is that key's value, per head group
    first, _ = dot_product_attention(q, k, v, implementation=implementation, causal=True)
    np.testing.assert_allclose(first[0], jnp.repeat(v[0], 2, axis=0), atol=1e-6)


def test_causal_flag_is_for_self_attention_without_a_cache(key):
    q = jax.random.normal(key, (2, 2, 4))
    kv = jax.random.normal(key, (5, 2, 4))
    with pytest.raises(ValueError, match="2 queries and 5 keys; with a KV cache pass the mask"):
        dot_product_attention(q, kv, kv, causal=True)


def test_attention_dropout_needs_key_and_respects_inference_mode(key):
    mha = MultiHeadAttention(8, 2, dropout_rate=0.5, key=key)
    x = jax.random.normal(key, (4, 8))
    plain = mha(x)
    assert np.allclose(plain, mha(x))  # no key: deterministic
    dropped = mha(x, key=jax.random.key(5))
    assert not np.allclose(plain, dropped)
    frozen = eqx.nn.inference_mode(mha)
    np.testing.assert_allclose(frozen(x, key=jax.random.key(5)), plain, atol=1e-6)


def test_head_dim_must_divide():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        MultiHeadAttention(10, 3, key=jax.random.key(0))


def test_kv_cache_write_places_rows():
    cache = KVCache.empty(5, 1, 2)
    new = jnp.ones((2, 1, 2))
    written = cache.write(new, 2 * new, 3)
    np.testing.assert_array_equal(written.keys[:, 0, 0], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(written.values[:, 0, 1], [0, 0, 0, 2, 2])
