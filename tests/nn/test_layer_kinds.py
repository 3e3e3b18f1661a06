"""The settings Gemma 2/3, OLMo 2 and Phi-3/4 add to existing parts, against hand computations.

`1 + weight` RMSNorm, soft-capped and `query_pre_attn_scalar`-scaled scores, QK-norm over the
whole projection, the sandwich and output-only norm placements, final logit soft-capping, and
local/global layers (a `LayerOverride` of the window and rotary base): scanned equals unrolled, an all-global pattern is the
model without a window, and the local layers rotate by their own base.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.gpt import LMHead
from zoo.nn import BlockInputs, LayerOverride, Mask, QKNorm
from zoo.nn.attention import attention_weights
from zoo.nn.multihead import AttentionSettings, MultiHeadAttention
from zoo.nn.norm import RMSNorm, make_norm
from zoo.nn.rotary import Rope, RotaryEmbedding

TOKENS = jnp.asarray([5, 9, 3, 17, 22, 8, 40, 11, 6, 30, 2, 14], jnp.int32)


def np_rms(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * scale


def test_an_offset_rmsnorm_scales_by_one_plus_its_weight():
    norm = RMSNorm(6, eps=1e-6, offset=1.0)
    np.testing.assert_array_equal(np.asarray(norm.weight), np.zeros(6))  # Gemma's init
    x = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    weight = np.linspace(-0.5, 0.5, 6).astype(np.float32)
    norm = eqx.tree_at(lambda n: n.weight, norm, jnp.asarray(weight))
    np.testing.assert_allclose(norm(jnp.asarray(x)), np_rms(x, 1.0 + weight, 1e-6), rtol=1e-5)
    with pytest.raises(ValueError, match="for RMSNorm"):
        make_norm("layernorm", 6, eps=1e-5, offset=1.0)


def test_soft_capped_scores_with_their_own_scale_match_numpy():
    rng = np.random.default_rng(1)
    query = rng.normal(size=(4, 2, 8)).astype(np.float32) * 3
    key = rng.normal(size=(4, 2, 8)).astype(np.float32) * 3
    ours = attention_weights(jnp.asarray(query), jnp.asarray(key), scale=20.0**-0.5, softcap=2.0)
    scores = np.einsum("qhd,khd->hqk", query, key) * 20.0**-0.5
    capped = 2.0 * np.tanh(scores / 2.0)
    expected = np.exp(capped) / np.exp(capped).sum(-1, keepdims=True)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(capped))) < 2.0


def test_qk_norm_over_the_whole_projection_normalises_all_heads_at_once():
    settings = AttentionSettings(num_heads=2, qk_norm=QKNorm(scope="projection"), qkv_bias=False)
    attention = MultiHeadAttention(8, settings, key=jax.random.key(0))
    assert attention.query_norm is not None and attention.query_norm.weight.shape == (8,)
    x = jax.random.normal(jax.random.key(1), (3, 8))
    projected = np.asarray(attention.query_proj(x))
    expected = np_rms(projected, 1.0, 1e-6).reshape(3, 2, 4)
    np.testing.assert_allclose(attention.project_query(x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="qk_norm scope must be one of"):
        QKNorm(scope="heads")


def with_norm_weights(model, value: float):
    """Every norm weight of a model set to `value`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: (
            jnp.full_like(leaf, value) if "norm" in jax.tree_util.keystr(path) else leaf
        ),
        model,
    )


@eqx.filter_jit
def by_hand(block, x, sandwich: bool):
    """A sandwich (Gemma) or output-only (OLMo 2) block, written out from its parts."""
    table = block.self_attention.rotary_table(length=x.shape[0])
    mask = Mask(causal=True)

    def attend(h):
        keys, values = block.self_attention.project_key_value(h, table)
        query = block.self_attention.project_query(h, table)
        return block.self_attention.attend(query, keys, values, mask)[0]

    if sandwich:
        h = x + block.self_attention_output_norm(attend(block.self_attention_norm(x)))
        ff = block.feed_forward(block.feed_forward_norm(h))
        return h + block.feed_forward_output_norm(ff)
    h = x + block.self_attention_norm(attend(x))
    return h + block.feed_forward_norm(block.feed_forward(h))


@pytest.mark.parametrize(("preset", "sandwich"), [("gemma-2-tiny", True), ("olmo-2-tiny", False)])
def test_norm_placements_compute_what_they_say(preset, sandwich):
    model = zoo.create(preset, key=jax.random.key(0), remat=None)
    block = with_norm_weights(model, 0.3).layers.layer(0)  # norms that do something
    assert (block.self_attention_output_norm is not None) == sandwich
    x = jax.random.normal(jax.random.key(2), (5, 64))
    ours, _ = eqx.filter_jit(block)(x, BlockInputs(mask=Mask(causal=True)))
    np.testing.assert_allclose(ours, by_hand(block, x, sandwich), rtol=1e-5, atol=1e-5)


@eqx.filter_jit
def logits(model):
    return model(TOKENS)


def tiny(preset: str, **overrides):
    return zoo.create(preset, key=jax.random.key(0), remat=None, **overrides)


def test_final_logit_soft_capping_bounds_the_logits():
    capped = logits(tiny("gemma-2-tiny", init_std=1.0))
    raw = logits(tiny("gemma-2-tiny", init_std=1.0, head=LMHead(softcap=None)))
    np.testing.assert_allclose(capped, 30.0 * np.tanh(np.asarray(raw) / 30.0), rtol=1e-5, atol=1e-4)
    assert float(jnp.max(jnp.abs(raw))) > 30.0 > float(jnp.max(jnp.abs(capped)))


@pytest.mark.parametrize("preset", ["gemma-2-tiny", "gemma-3-tiny"])
def test_scanned_local_global_layers_equal_unrolled(preset):
    scanned = logits(tiny(preset, layer_loop="scan"))
    unrolled = logits(tiny(preset, layer_loop="unroll"))
    np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)


def test_all_global_layers_are_the_model_without_a_window():
    every_layer = (LayerOverride(changes={"attention.window": None}),)
    all_global = logits(tiny("gemma-2-tiny", **{"layers.overrides": every_layer}))
    no_window = logits(tiny("gemma-2-tiny", **{"attention.window": None, "layers.overrides": ()}))
    np.testing.assert_allclose(all_global, no_window, rtol=1e-5, atol=1e-5)
    # the window of 8 on layers 0 and 2 changes the logits of positions 8 and after only
    alternating = logits(tiny("gemma-2-tiny"))
    assert not np.allclose(alternating[8:], no_window[8:], atol=1e-3)
    np.testing.assert_allclose(alternating[:8], no_window[:8], rtol=1e-5, atol=1e-5)


def test_the_local_layers_rotate_by_their_own_base():
    own_base = logits(tiny("gemma-3-tiny"))
    same_base = logits(tiny("gemma-3-tiny", **{"attention.rope": Rope(theta=1_000_000.0)}))
    assert not np.allclose(own_base, same_base, atol=1e-4)
    beyond = (LayerOverride(changes={"attention.window": None}, layers=(5, 7)),)
    with pytest.raises(ValueError, match=r"names layers \[7\], which a 7-layer stack"):
        zoo.presets.config("gemma-3-tiny", **{"layers.overrides": beyond})


def test_partial_rotary_turns_the_first_dimensions_and_passes_the_rest():
    rope = Rope(partial_rotary_factor=0.75)
    rotary = RotaryEmbedding(8, rope)
    x = jax.random.normal(jax.random.key(3), (5, 2, 8))
    table = rotary.table(jnp.arange(5))
    assert table.cos.shape == (5, 6)
    rotated = rotary(x, table)
    np.testing.assert_array_equal(rotated[..., 6:], x[..., 6:])
    full = RotaryEmbedding(6, Rope())
    np.testing.assert_allclose(
        rotated[..., :6], full(x[..., :6], full.table(jnp.arange(5))), atol=1e-6
    )


def test_longrope_switches_to_its_long_factors_past_the_original_context():
    rope = Rope(
        scaling="longrope",
        short_factor=(1.0, 2.0),
        long_factor=(4.0, 8.0),
        original_max_positions=6,
        factor=8.0,
    )
    base = 1.0 / 10000.0 ** (np.arange(0, 4, 2) / 4)
    within = rope.frequencies_at(4, jnp.arange(6))
    beyond = rope.frequencies_at(4, jnp.arange(7))
    np.testing.assert_allclose(within, base / np.array([1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(beyond, base / np.array([4.0, 8.0]), rtol=1e-6)
    # cos and sin carry sqrt(1 + ln(factor) / ln(original))
    table = RotaryEmbedding(4, rope).table(jnp.zeros(1, jnp.int32))
    np.testing.assert_allclose(table.cos, np.sqrt(1 + np.log(8.0) / np.log(6.0)), rtol=1e-6)
    with pytest.raises(ValueError, match="one length"):
        Rope(scaling="longrope", short_factor=(1.0,), long_factor=(1.0, 2.0))
