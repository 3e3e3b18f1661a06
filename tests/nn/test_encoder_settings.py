"""Encoder settings ModernBERT uses: a LayerNorm without bias, a two-sided window, and a stack
whose first layer's attention reads its input without the norm."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import LayerNorm
from zoo.nn.block import BlockInputs, BlockSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.mask import Mask
from zoo.nn.multihead import AttentionSettings
from zoo.nn.plan import LayerOverride, LayerPlan
from zoo.nn.stack import LayerStack


def test_layernorm_without_bias_is_centred_and_scaled_only():
    x = jnp.array([[1.0, 2.0, 3.0, 6.0]])
    norm = LayerNorm(4, eps=1e-5, bias=False)
    assert norm.bias is None
    centred = np.array([[-2.0, -1.0, 0.0, 3.0]])
    expected = centred / np.sqrt(np.mean(centred**2) + 1e-5)
    np.testing.assert_allclose(norm(x), expected, rtol=1e-5)


def test_two_sided_window_as_array_and_kernel_arguments():
    mask = Mask(window=3, key_length=jnp.array(5))
    allowed = np.asarray(mask.array(6, 6))
    distance = np.abs(np.subtract.outer(np.arange(6), np.arange(6)))
    np.testing.assert_array_equal(allowed, (distance <= 2) & (np.arange(6) < 5)[None, :])
    arguments = mask.kernel_arguments(6, 6)
    assert arguments is not None
    assert (arguments.is_causal, arguments.local_window_size) == (False, (2, 2))
    assert Mask(window=3).is_empty is False
    # a causal window keeps its left-only form
    assert Mask(causal=True, window=3).kernel_arguments(6, 6).local_window_size == (2, 0)


def _stack(scan: bool, first_attention_norm: bool) -> LayerStack:
    settings = BlockSettings(
        attention=AttentionSettings(num_heads=2),
        feed_forward=FeedForwardSettings(d_ff=16),
        norm_first=True,
    )
    first = LayerOverride(changes={"attention_norm": False}, layers=(0,))
    overrides = () if first_attention_norm else (first,)
    plan = LayerPlan(block=settings, num_layers=3, overrides=overrides)
    return LayerStack(plan, 8, scan=scan, key=jax.random.key(0))


@pytest.mark.parametrize("scan", [True, False])
def test_first_layer_attention_reads_its_input_without_the_norm(scan):
    x = jax.random.normal(jax.random.key(1), (5, 8))
    plain = _stack(scan, first_attention_norm=False)
    out, _ = plain(x)
    # layer 0 is a group of its own, without the norm's weight; the others keep theirs
    assert plain.layer(0).self_attention_norm is None
    assert plain.layer(1).self_attention_norm is not None
    assert plain.groups[1].self_attention_norm.weight.shape == (2, 8)
    normed = _stack(scan, first_attention_norm=True)
    assert np.max(np.abs(np.asarray(normed(x)[0]) - np.asarray(out))) > 1e-3
    # the same as the normed stack's layers (same keys, same weights) by hand, layer 0's
    # attention reading its input as it is
    first = eqx.tree_at(lambda b: b.self_attention_norm, normed.layer(0), None)
    h, _ = first(x, BlockInputs())
    for index in (1, 2):
        h, _ = normed.layer(index)(h)
    np.testing.assert_allclose(out, h, rtol=1e-5, atol=1e-5)


def test_scanned_and_unrolled_agree():
    x = jax.random.normal(jax.random.key(2), (4, 8))
    scanned, _ = _stack(True, first_attention_norm=False)(x)
    unrolled, _ = _stack(False, first_attention_norm=False)(x)
    np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-6)
