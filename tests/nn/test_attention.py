from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import (
    AttentionSettings,
    Init,
    KernelOptions,
    KVCache,
    Mask,
    MultiHeadAttention,
    attention_weights,
)
from zoo.nn.attention import dot_product_attention

XLA = KernelOptions("xla")


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
    mha = MultiHeadAttention(
        d_model, AttentionSettings(num_heads=heads), init=Init(std=0.3), key=key
    )
    # non-zero biases, so a missing bias would show
    params, static = eqx.partition(mha, eqx.is_array)
    params = jax.tree_util.tree_map(lambda a: a + 0.1 if a.ndim == 1 else a, params)
    return eqx.combine(params, static)


@pytest.mark.parametrize("weights_path", [False, True])
def test_self_attention_matches_numpy(key, weights_path):
    mha = random_mha(key)
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, 12)))
    mask = np.asarray(Mask(causal=True, key_length=jnp.array(4)).array(5, 5))
    q = mha.project_query(jnp.asarray(x))
    k, v = mha.project_key_value(jnp.asarray(x))
    out, _ = mha.attend(q, k, v, jnp.asarray(mask), return_weights=weights_path)
    np.testing.assert_allclose(out, numpy_attention(mha, x, x, mask), atol=1e-5)


def test_cross_attention_matches_numpy(key):
    mha = random_mha(key)
    x = np.asarray(jax.random.normal(jax.random.key(1), (4, 12)))
    context = np.asarray(jax.random.normal(jax.random.key(2), (6, 12)))
    mask = np.asarray(Mask(key_length=jnp.array(4)).array(4, 6))
    out = mha(jnp.asarray(x), jnp.asarray(context), mask=jnp.asarray(mask))
    np.testing.assert_allclose(out, numpy_attention(mha, x, context, mask), atol=1e-5)


def test_weights_rows_sum_to_one_over_unmasked_keys(key):
    q = jax.random.normal(key, (4, 2, 8))
    k = jax.random.normal(jax.random.key(3), (4, 2, 8))
    mask = Mask(causal=True, key_length=jnp.array(3)).array(4, 4)
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


def test_the_kernel_options_are_one_record():
    """0.2 takes `options=KernelOptions(...)` only: the loose keywords of 0.1 are refused."""
    q = jax.random.normal(jax.random.key(0), (3, 2, 4))
    k, v = (jax.random.normal(jax.random.key(seed), (5, 2, 4)) for seed in (1, 2))
    unscaled, _ = dot_product_attention(q, k, v, options=KernelOptions("xla", scale=False))
    scaled, _ = dot_product_attention(q, k, v, options=KernelOptions("xla"))
    assert not np.allclose(unscaled, scaled)
    with pytest.raises(TypeError, match="unexpected keyword argument 'implementation'"):
        dot_product_attention(q, k, v, implementation="xla")  # type: ignore[call-arg]


def test_fused_and_explicit_paths_agree(key):
    q = jax.random.normal(key, (5, 2, 4))
    k = jax.random.normal(jax.random.key(1), (7, 2, 4))
    v = jax.random.normal(jax.random.key(2), (7, 2, 4))
    mask = Mask(key_length=jnp.array(5))
    fused, none = dot_product_attention(q, k, v, mask, options=XLA)
    explicit, weights = dot_product_attention(q, k, v, mask, return_weights=True)
    assert none is None and weights.shape == (2, 5, 7)
    np.testing.assert_allclose(fused, explicit, atol=1e-5)


MASKS = {
    "causal": lambda: Mask(causal=True),
    "causal, 4 real keys": lambda: Mask(causal=True, key_length=jnp.array(4)),
    "4 real keys": lambda: Mask(key_length=jnp.array(4)),
    "4 real queries, 5 real keys": lambda: Mask(key_length=jnp.array(5), query_length=jnp.array(4)),
    "no real key": lambda: Mask(key_length=jnp.array(0)),
    "window of 3": lambda: Mask(causal=True, window=3),
    "window of 2, 5 real keys": lambda: Mask(causal=True, window=2, key_length=jnp.array(5)),
    "segments": lambda: Mask(
        query_segments=jnp.array([0, 0, 1, 1, 1, 2]), key_segments=jnp.array([0, 0, 1, 1, 1, 2])
    ),
    "explicit": lambda: Mask(explicit=jnp.eye(6, dtype=bool) | jnp.eye(6, k=-2, dtype=bool)),
}


@pytest.mark.parametrize("implementation", [None, "xla"])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_every_mask_equals_its_array_in_value_and_gradient(key, implementation, name):
    """Lengths, flags and windows on the fused path equal the mask's array on the explicit one.

    On the fused path the mask reaches `jax.nn.dot_product_attention` as `is_causal`, sequence
    lengths and `local_window_size` (segments and explicit masks as the array)."""
    q = jax.random.normal(key, (6, 4, 8))
    k, v = (jax.random.normal(jax.random.key(seed), (6, 2, 8)) for seed in (1, 2))
    mask = MASKS[name]()

    def total(q, k, v, mask, implementation):
        out, _ = dot_product_attention(q, k, v, mask, options=KernelOptions(implementation))
        return jnp.sum(out * jnp.arange(8.0)[None, None, :]), out

    grad = jax.value_and_grad(total, (0, 1, 2), has_aux=True)
    (_, expected), grads = grad(q, k, v, mask.array(6, 6), "explicit")
    (_, found), mask_grads = grad(q, k, v, mask, implementation)
    np.testing.assert_allclose(found, expected, atol=1e-6)
    for ours, theirs in zip(mask_grads, grads):  # gradients reach ~20: a few float32 ulps
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    answered = np.asarray(jnp.any(mask.array(6, 6), axis=-1))
    np.testing.assert_array_equal(np.any(np.asarray(found) != 0, axis=(1, 2)), answered)


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_causal_mask_lets_the_first_query_see_only_the_first_key(key, implementation):
    q = jax.random.normal(key, (6, 4, 8))
    k, v = (jax.random.normal(jax.random.key(seed), (6, 2, 8)) for seed in (1, 2))
    first, _ = dot_product_attention(
        q, k, v, Mask(causal=True), options=KernelOptions(implementation)
    )
    np.testing.assert_allclose(first[0], jnp.repeat(v[0], 2, axis=0), atol=1e-6)


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_one_query_after_a_cache_sees_the_filled_prefix(key, implementation):
    """A decoding step: one query at offset 3 of an 8-slot cache sees keys 0..3 only."""
    q = jax.random.normal(key, (1, 2, 8))
    k, v = (jax.random.normal(jax.random.key(seed), (8, 2, 8)) for seed in (1, 2))
    mask = Mask(causal=True, offset=jnp.array(3))
    found, _ = dot_product_attention(q, k, v, mask, options=KernelOptions(implementation))
    expected, _ = dot_product_attention(q, k[:4], v[:4], options=KernelOptions("explicit"))
    np.testing.assert_allclose(found, expected, atol=1e-6)


def test_attention_dropout_needs_key_and_respects_inference_mode(key):
    mha = MultiHeadAttention(8, AttentionSettings(num_heads=2, dropout=0.5), key=key)
    x = jax.random.normal(key, (4, 8))
    plain = mha(x)
    assert np.allclose(plain, mha(x))  # no key: deterministic
    dropped = mha(x, key=jax.random.key(5))
    assert not np.allclose(plain, dropped)
    frozen = eqx.nn.inference_mode(mha)
    np.testing.assert_allclose(frozen(x, key=jax.random.key(5)), plain, atol=1e-6)


def test_head_dim_must_divide():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        MultiHeadAttention(10, AttentionSettings(num_heads=3), key=jax.random.key(0))


def test_kv_cache_write_places_rows():
    cache = KVCache.empty(5, 1, 2).advance(3)
    new = jnp.ones((2, 1, 2))
    written = cache.write(new, 2 * new)
    np.testing.assert_array_equal(written.keys[:, 0, 0], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(written.values[:, 0, 1], [0, 0, 0, 2, 2])
    assert int(written.index) == 3 and int(written.advance(2).index) == 5
    stacked = KVCache.empty(5, 1, 2, layers=3)
    assert stacked.keys.shape == (3, 5, 1, 2) and stacked.capacity == 5
    assert stacked.layer(1).keys.shape == (5, 1, 2)


@pytest.mark.parametrize(
    "seq, kv_seq, causal, key_length, with_bias",
    [
        (7, 7, True, None, False),  # a causal batch of odd length
        (1, 9, False, 6, False),  # a decoding step over a cache of odd size
        (6, 9, False, 4, True),  # cross-attention with T5's bias
        (5, 8, False, None, True),  # odd queries only
        (4, 9, False, None, False),  # odd keys, no lengths: the added key must be left out
    ],
)
def test_the_padding_to_even_lengths_keeps_outputs_and_gradients(
    seq, kv_seq, causal, key_length, with_bias
):
    """cuDNN's training rule needs even lengths; `_even_lengths` pads the operands and the
    key lengths leave the added key out. The padded call (XLA's kernel, sliced back), and the
    call that pads only where differentiated, give the unpadded call's outputs and gradients."""
    from zoo.nn.kernel import _call_kernel, _even_lengths, _even_when_differentiated
    from zoo.nn.mask import KernelArguments

    keys = jax.random.split(jax.random.key(3), 5)
    query = jax.random.normal(keys[0], (seq, 2, 8))
    key = jax.random.normal(keys[1], (kv_seq, 2, 8))
    value = jax.random.normal(keys[2], (kv_seq, 2, 8))
    bias = jax.random.normal(keys[3], (2, seq, kv_seq)) if with_bias else None
    cotangent = jax.random.normal(keys[4], (seq, 2, 8))
    lengths = None if key_length is None else jnp.array([key_length], jnp.int32)

    def attend(query, key, value, bias, lengths):
        return jax.nn.dot_product_attention(
            query[None],
            key[None],
            value[None],
            bias=None if bias is None else bias[None],
            is_causal=causal,
            key_value_seq_lengths=lengths,
            implementation="xla",
        )[0]

    def plain(query, key, value, bias):
        return jnp.sum(attend(query, key, value, bias, lengths) * cotangent)

    def padded(query, key, value, bias):
        q, k, v, b, n = _even_lengths(query, key, value, bias, lengths, causal=causal)
        assert q.shape[0] % 2 == 0 and k.shape[0] % 2 == 0
        return jnp.sum(attend(q, k, v, b, n)[:seq] * cotangent)

    # the call as `fused_attention` makes it: padded only where differentiated
    arguments = KernelArguments(causal, None, lengths, None)
    kernel = partial(_call_kernel, mask_array=None, arguments=arguments, scale=True, kernel="xla")
    wrapped = _even_when_differentiated(lambda *operands: kernel(operands), causal)

    def through_the_wrapper(query, key, value, bias):
        return jnp.sum(wrapped(query, key, value, bias, None, lengths) * cotangent)

    expected = jax.value_and_grad(plain, argnums=(0, 1, 2))(query, key, value, bias)
    for variant in (padded, through_the_wrapper):
        found = jax.value_and_grad(variant, argnums=(0, 1, 2))(query, key, value, bias)
        for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(found), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
