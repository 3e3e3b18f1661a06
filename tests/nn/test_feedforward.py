import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import ACTIVATIONS, FeedForward, FeedForwardSettings, Init


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("relu", 1.0),
        ("gelu", 0.8413447460685429),  # 1 * Phi(1)
        ("gelu_tanh", 0.8411919906082768),  # tanh approximation at 1
        ("silu", 0.7310585786300049),  # 1 * sigmoid(1)
    ],
)
def test_activation_values_at_one(name, value):
    np.testing.assert_allclose(ACTIVATIONS[name](jnp.array(1.0)), value, rtol=1e-6)


def test_feedforward_matches_numpy(key):
    ff = FeedForward(4, FeedForwardSettings(d_ff=6, activation="relu"), init=Init(std=0.5), key=key)
    x = np.asarray(jax.random.normal(key, (3, 4)))
    hidden = np.maximum(x @ np.asarray(ff.hidden.weight).T + np.asarray(ff.hidden.bias), 0)
    expected = hidden @ np.asarray(ff.output.weight).T + np.asarray(ff.output.bias)
    np.testing.assert_allclose(ff(jnp.asarray(x)), expected, atol=1e-6)


def test_unknown_activation(key):
    with pytest.raises(ValueError, match="unknown activation 'tanhh'"):
        FeedForwardSettings(d_ff=6, activation="tanhh")


def test_bad_kind_and_width_are_refused():
    with pytest.raises(ValueError, match="feed_forward kind must be one of"):
        FeedForwardSettings(d_ff=6, kind="moe")
    with pytest.raises(ValueError, match="d_ff must be a positive integer, got 0"):
        FeedForwardSettings(d_ff=0)


def test_dense_has_no_gate_and_gated_has_one(key):
    dense = FeedForward(4, FeedForwardSettings(d_ff=6), key=key)
    gated = FeedForward(4, FeedForwardSettings(d_ff=6, kind="gated"), key=key)
    assert dense.gate is None and gated.gate is not None
    assert gated.hidden.bias is not None
    unbiased = FeedForward(4, FeedForwardSettings(d_ff=6, bias=False), key=key)
    assert unbiased.hidden.bias is None and unbiased.output.bias is None
