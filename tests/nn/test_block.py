import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import (
    AttentionSettings,
    BlockInputs,
    BlockSettings,
    CrossInputs,
    FeedForwardSettings,
    LayerNorm,
    TransformerBlock,
)


def basic(num_heads: int, d_ff: int, *, cross_attention: bool = False, **fields) -> BlockSettings:
    """A block of `num_heads` heads and a dense GELU feed-forward of width `d_ff`."""
    attention = AttentionSettings(num_heads=num_heads)
    return BlockSettings(
        attention=attention,
        feed_forward=FeedForwardSettings(d_ff=d_ff),
        cross_attention=attention if cross_attention else None,
        **fields,
    )


def zero_sublayers(block):
    """Every projection weight and bias set to zero: attention and feed-forward output 0."""
    params, static = eqx.partition(block, eqx.is_array)
    norms = {id(n.weight) for n in (block.self_attention_norm, block.feed_forward_norm)}
    params = jax.tree_util.tree_map(lambda a: a if id(a) in norms else jnp.zeros_like(a), params)
    return eqx.combine(params, static)


def test_pre_ln_with_zero_sublayers_is_identity(key):
    block = zero_sublayers(TransformerBlock(8, basic(2, 16, norm_first=True), key=key))
    x = jax.random.normal(key, (3, 8))
    out, _ = block(x)
    np.testing.assert_allclose(out, x, atol=1e-6)


def test_post_ln_with_zero_sublayers_is_layernorm(key):
    block = zero_sublayers(TransformerBlock(8, basic(2, 16, norm_first=False), key=key))
    x = jax.random.normal(key, (3, 8))
    out, _ = block(x)
    x_np = np.asarray(x)
    expected = (x_np - x_np.mean(-1, keepdims=True)) / np.sqrt(x_np.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_post_ln_output_is_normalised_and_pre_ln_is_not(key):
    x = 3.0 * jax.random.normal(key, (4, 16))
    post, _ = TransformerBlock(16, basic(2, 32, norm_first=False), key=key)(x)
    pre, _ = TransformerBlock(16, basic(2, 32, norm_first=True), key=key)(x)
    np.testing.assert_allclose(np.asarray(post).std(-1), 1.0, atol=1e-3)
    assert abs(float(np.asarray(pre).std(-1).mean()) - 1.0) > 0.5


def test_layernorm_matches_numpy():
    norm = LayerNorm(5, eps=1e-12)
    x = np.arange(10, dtype=np.float32).reshape(2, 5) ** 2
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(norm(jnp.asarray(x)), expected, rtol=1e-5)


def test_cross_attention_block_needs_memory(key):
    block = TransformerBlock(8, basic(2, 16, cross_attention=True), key=key)
    with pytest.raises(ValueError, match="pass the memory's cross inputs"):
        block(jnp.ones((2, 8)))
    memory = jax.random.normal(key, (5, 8))
    cross = CrossInputs(*block.cross_attention.project_key_value(memory))
    out, extras = block(jnp.ones((2, 8)), BlockInputs(cross=cross), return_weights=True)
    assert out.shape == (2, 8) and extras.cross_weights.shape == (2, 2, 5)
