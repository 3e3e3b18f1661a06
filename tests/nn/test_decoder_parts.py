"""The parts of today's decoders against hand-computed cases and numpy references:
RMSNorm, rotary positions (plain, linear, llama3), grouped-query attention, QK-norm, the gated
feed-forward, the sliding window and the KV cache of key/value heads only."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.nn import (
    AttentionSettings,
    FeedForward,
    FeedForwardSettings,
    Init,
    KernelOptions,
    Mask,
    MultiHeadAttention,
    QKNorm,
    RMSNorm,
    Rope,
    RotaryEmbedding,
    attention_weights,
    make_norm,
)
from zoo.nn.attention import dot_product_attention


def test_rms_norm_by_hand():
    norm = RMSNorm(2, eps=0.0)
    norm = eqx.tree_at(lambda n: n.weight, norm, jnp.array([1.0, 2.0]))
    # rms of (3, 4) is sqrt(12.5)
    out = norm(jnp.array([[3.0, 4.0]]))
    rms = math.sqrt(12.5)
    np.testing.assert_allclose(out, [[3.0 / rms, 8.0 / rms]], rtol=1e-6)


def test_rms_norm_in_bf16_computes_in_fp32():
    norm = RMSNorm(4, eps=1e-6, dtype=jnp.bfloat16)
    x = jnp.array([1000.0, 1001.0, 999.0, 1000.5], jnp.bfloat16)
    out = norm(x)
    assert out.dtype == jnp.bfloat16
    x64 = np.asarray(x, np.float64)
    expected = x64 / np.sqrt(np.mean(x64**2) + 1e-6)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=4e-3)


def test_make_norm_chooses_by_name():
    assert isinstance(make_norm("rmsnorm", 4, eps=1e-5), RMSNorm)
    assert make_norm("layernorm", 4, eps=1e-5).bias.shape == (4,)
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        make_norm("batchnorm", 4, eps=1e-5)


def test_rotary_rotates_each_pair_by_position_times_frequency():
    rotary = RotaryEmbedding(4, Rope(theta=100.0))
    # pairs are (dim 0, dim 2) with frequency 1 and (dim 1, dim 3) with frequency 100^-1/2
    x = jnp.array([[[1.0, 1.0, 0.0, 0.0]]] * 3)  # [seq 3, heads 1, head_dim 4]
    out = rotary(x, rotary.table(jnp.array([0, 1, 5])))
    for row, p in enumerate([0, 1, 5]):
        expected = [math.cos(p), math.cos(p / 10), math.sin(p), math.sin(p / 10)]
        np.testing.assert_allclose(out[row, 0], expected, atol=1e-6)


def test_rotary_scores_depend_on_the_distance_only(key):
    rotary = RotaryEmbedding(8, Rope(theta=10000.0))
    q_key, k_key = jax.random.split(key)
    q = jax.random.normal(q_key, (1, 1, 8))
    k = jax.random.normal(k_key, (1, 1, 8))

    def score(query_position, key_position):
        rotated_q = rotary(q, rotary.table(jnp.array([query_position])))
        rotated_k = rotary(k, rotary.table(jnp.array([key_position])))
        return float(jnp.sum(rotated_q * rotated_k))

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_linear_scaling_divides_every_frequency():
    plain = Rope(theta=10000.0).inverse_frequencies(8)
    linear = Rope(theta=10000.0, scaling="linear", factor=4.0).inverse_frequencies(8)
    np.testing.assert_allclose(linear, plain / 4.0, rtol=1e-6)


def test_llama3_scaling_by_hand():
    # head_dim 8, theta 10000: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 63, 628, 6283)
    scaled = Rope(
        theta=10000.0,
        scaling="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_positions=1000,
    ).inverse_frequencies(8)
    # wavelength < 1000 / 4: kept; > 1000 / 1: divided by 8; between: blended
    smooth = (1000 / (2 * math.pi / 0.01) - 1.0) / (4.0 - 1.0)
    blended = (1 - smooth) * 0.01 / 8 + smooth * 0.01
    np.testing.assert_allclose(scaled, [1.0, 0.1, blended, 0.001 / 8], rtol=1e-5)


@pytest.mark.hf
def test_llama3_frequencies_equal_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(
        rope_type="llama3",
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(scaling),
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    rope = Rope.from_hf({"rope_theta": 500000.0, **scaling})
    assert rope == Rope(theta=500000.0, scaling="llama3", factor=32.0)
    np.testing.assert_allclose(rope.inverse_frequencies(32), theirs.numpy(), rtol=1e-6)
    assert rope.to_hf() == (500000.0, scaling)  # and back, as transformers writes it


def test_grouped_query_attention_equals_repeated_keys(key):
    q_key, k_key, v_key = jax.random.split(key, 3)
    query = jax.random.normal(q_key, (5, 6, 4))  # 6 query heads
    keys = jax.random.normal(k_key, (7, 2, 4))  # 2 key/value heads: 3 query heads each
    values = jax.random.normal(v_key, (7, 2, 4))
    mask = Mask(key_length=jnp.array(6))
    out, _ = dot_product_attention(query, keys, values, mask)
    repeated_k = np.repeat(np.asarray(keys), 3, axis=1)  # head h reads kv head h // 3
    repeated_v = np.repeat(np.asarray(values), 3, axis=1)
    reference, _ = dot_product_attention(
        query, jnp.asarray(repeated_k), jnp.asarray(repeated_v), mask
    )
    np.testing.assert_allclose(out, reference, atol=1e-6)
    fused, _ = dot_product_attention(query, keys, values, mask, options=KernelOptions("xla"))
    np.testing.assert_allclose(fused, reference, atol=1e-5)
    weights = attention_weights(query, keys, mask.array(5, 7))
    assert weights.shape == (6, 5, 7)
    np.testing.assert_allclose(weights[:, :, 6], 0.0)


def test_a_kv_head_count_that_does_not_divide_the_heads_is_refused(key):
    with pytest.raises(ValueError, match="num_kv_heads=4 must divide num_heads=6"):
        AttentionSettings(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads=4 must divide num_heads=6"):
        zoo.GPTConfig().replace(d_model=12, num_heads=6, **{"attention.num_kv_heads": 4})


def test_attention_parts_shapes_and_biases(key):
    settings = AttentionSettings(
        num_heads=4,
        num_kv_heads=1,
        head_dim=6,
        qkv_bias=True,
        output_bias=False,
        qk_norm=QKNorm(),
    )
    mha = MultiHeadAttention(16, settings, key=key)
    assert mha.query_proj.weight.shape == (24, 16)
    assert mha.key_proj.weight.shape == (6, 16) and mha.value_proj.weight.shape == (6, 16)
    assert mha.output_proj.weight.shape == (16, 24)
    assert mha.key_proj.bias is not None and mha.output_proj.bias is None
    assert mha.query_norm is not None and mha.query_norm.weight.shape == (6,)


def test_qk_norm_normalises_each_head_before_rotary(key):
    settings = AttentionSettings(num_heads=2, qk_norm=QKNorm(), rope=Rope())
    mha = MultiHeadAttention(8, settings, init=Init(std=1.0), key=key)
    x = jax.random.normal(jax.random.key(3), (3, 8))
    query = mha.project_query(x, mha.rotary_table(jnp.arange(3)))
    # RMSNorm (unit weight) then a rotation: every head vector has norm sqrt(head_dim)
    np.testing.assert_allclose(jnp.linalg.norm(query, axis=-1), 2.0, rtol=1e-5)
    raw = (x @ mha.query_proj.weight.T).reshape(3, 2, 4)
    normed = raw / jnp.sqrt(jnp.mean(raw**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(query[0], normed[0], atol=1e-5)  # position 0: no rotation


def test_gated_feed_forward_is_silu_gate_times_up(key):
    settings = FeedForwardSettings(d_ff=6, activation="silu", kind="gated", bias=False)
    ff = FeedForward(4, settings, init=Init(std=0.5), key=key)
    x = jax.random.normal(jax.random.key(1), (3, 4))
    gate = np.asarray(x @ ff.gate.weight.T)
    up = np.asarray(x @ ff.hidden.weight.T)
    silu = gate / (1 + np.exp(-gate))
    expected = (silu * up) @ np.asarray(ff.output.weight).T
    np.testing.assert_allclose(ff(x), expected, rtol=1e-5, atol=1e-6)


def test_sliding_window_mask_by_hand():
    mask = Mask(causal=True, window=2).array(5, 5)
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(mask, expected)
    # in cached decoding, the query at absolute position 4 sees positions 3 and 4 of the cache
    cached = Mask(causal=True, offset=jnp.array(4), window=2).array(1, 8)
    np.testing.assert_array_equal(cached[0], [0, 0, 0, 1, 1, 0, 0, 0])
    # without the causal order the window is two-sided: less than 2 positions either way
    two_sided = Mask(window=2).array(4, 4)
    np.testing.assert_array_equal(two_sided, np.abs(np.subtract.outer(range(4), range(4))) < 2)


def test_sliding_window_cached_decoding_equals_full_forward():
    model = zoo.create("llama-tiny", key=jax.random.key(0), **{"attention.window": 3})
    tokens = jnp.array([5, 9, 3, 12, 7, 30, 4, 8])
    full = model(tokens)
    cache = model.init_cache(8)
    steps = []
    for index in range(8):
        logits, cache = model.extend(tokens[index : index + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps), full, atol=1e-5)
    # the window matters: without it the last position's logits differ
    assert not np.allclose(zoo.create("llama-tiny", key=jax.random.key(0))(tokens)[-1], full[-1])


def test_kv_cache_holds_kv_heads_only_and_its_bytes_per_token():
    model = zoo.create("llama-tiny", key=jax.random.key(0))
    cache = model.init_cache(16)
    c = model.config
    assert cache.keys.shape == (c.num_layers, 16, c.kv_heads, c.head_dim) == (2, 16, 2, 16)
    per_token = (cache.keys.nbytes + cache.values.nbytes) // 16
    assert per_token == model.kv_cache_bytes_per_token() == 2 * 2 * 2 * 16 * 4
    # llama-3.2-1b: 2 (k, v) * 16 layers * 8 kv heads * 64 dims * 2 bytes (bf16) = 32 KiB
    big = zoo.presets.abstract("llama-3.2-1b")
    assert big.kv_cache_bytes_per_token(jnp.bfloat16) == 32768


def test_left_padding_gets_the_positions_of_the_unpadded_sequence():
    model = zoo.create("llama-tiny", key=jax.random.key(0))
    tokens = jnp.array([5, 9, 3, 12])
    plain = model(tokens)
    left = model(jnp.array([0, 0, 5, 9, 3, 12]), jnp.array([False, False, True, True, True, True]))
    np.testing.assert_allclose(left[2:], plain, atol=1e-5)


def test_yarn_scaling_by_hand():
    # head_dim 8, theta 10000: frequencies 1, 0.1, 0.01, 0.001. Over 1000 original positions
    # the pair turning 32 times sits at 0.70 (floor 0), the one turning once at 2.20 (ceil 3):
    # pair 0 kept, pair 3 divided by 4, pairs 1 and 2 blended along the ramp between.
    rope = Rope(theta=10000.0, scaling="yarn", factor=4.0, original_max_positions=1000)
    kept = np.array([1.0, 2 / 3, 1 / 3, 0.0])
    plain = np.array([1.0, 0.1, 0.01, 0.001])
    expected = plain * kept + plain / 4.0 * (1 - kept)
    np.testing.assert_allclose(rope.inverse_frequencies(8), expected, rtol=1e-5)
    assert rope.table_scale == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert Rope(scaling="yarn", factor=4.0, attention_factor=1.5).table_scale == 1.5


@pytest.mark.hf
@pytest.mark.parametrize(
    "extra", [{"attention_factor": 1.2079441541679836}, {"truncate": False}, {}]
)
def test_yarn_frequencies_and_attention_factor_equal_transformers(extra):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(
        rope_type="yarn",
        factor=8.0,
        original_max_position_embeddings=8192,
        beta_fast=32.0,
        beta_slow=1.0,
        **extra,
    )
    config = transformers.LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        max_position_embeddings=65536,
        rope_parameters=dict(scaling, rope_theta=500000.0),
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rope = Rope.from_hf({"rope_theta": 500000.0, **scaling})
    np.testing.assert_allclose(rope.inverse_frequencies(128), theirs.numpy(), rtol=1e-6)
    assert rope.table_scale == pytest.approx(attention_factor)
    assert rope.to_hf() == (500000.0, scaling)  # and back, as transformers writes it
