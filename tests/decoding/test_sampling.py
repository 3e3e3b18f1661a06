"""Token choice: the top-k and top-p filters on a known distribution, sampling, settings checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.decoding.sampling import (
    SamplingSettings,
    choose_token,
    filter_logits,
    top_k_filter,
    top_p_filter,
)

# probabilities by token id; sorted: 3 (0.4), 0 (0.3), 4 (0.15), 1 (0.1), 2 (0.05)
PROBS = np.array([0.3, 0.1, 0.05, 0.4, 0.15], np.float32)
LOGITS = jnp.log(jnp.asarray(PROBS))


def kept(filtered):
    return set(np.flatnonzero(np.isfinite(np.asarray(filtered))).tolist())


def test_top_k_keeps_the_k_most_likely_and_leaves_their_logits_alone():
    assert kept(top_k_filter(LOGITS, 1)) == {3}
    assert kept(top_k_filter(LOGITS, 2)) == {3, 0}
    assert kept(top_k_filter(LOGITS, 4)) == {3, 0, 4, 1}
    assert kept(top_k_filter(LOGITS, 99)) == {0, 1, 2, 3, 4}
    filtered = np.asarray(top_k_filter(LOGITS, 2))
    np.testing.assert_array_equal(filtered[[3, 0]], np.asarray(LOGITS)[[3, 0]])


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.35, {3}),  # 0.4 alone reaches 0.35
        (0.5, {3, 0}),  # 0.4 < 0.5, so the next token (0.3) is needed
        (0.71, {3, 0, 4}),  # 0.7 < 0.71
        (0.9, {3, 0, 4, 1}),  # 0.85 < 0.9
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_the_smallest_nucleus_reaching_p(top_p, expected):
    assert kept(top_p_filter(LOGITS, top_p)) == expected


def test_filters_apply_temperature_then_top_k_then_top_p():
    np.testing.assert_allclose(filter_logits(LOGITS, temperature=2.0), LOGITS / 2.0, rtol=1e-6)
    # After top-k=3 the three survivors renormalise to 0.47, 0.35, 0.18: 0.82 >= 0.8 after two,
    # so top-p=0.8 keeps two. On the unfiltered distribution it keeps three (0.7 < 0.8).
    assert kept(filter_logits(LOGITS, top_k=3, top_p=0.8)) == {3, 0}
    assert kept(filter_logits(LOGITS, top_p=0.8)) == {3, 0, 4}


def draw(key, num, **filters):
    settings = SamplingSettings(temperature=1.0, **filters)
    keys = jax.random.split(key, num)
    draws = jax.jit(jax.vmap(choose_token, in_axes=(None, 0, None)))(
        LOGITS, keys, settings.values()
    )
    return np.asarray(draws)


def test_sampling_stays_inside_top_k_and_matches_the_renormalised_probabilities(key):
    draws = draw(key, 4000, top_k=2)
    assert set(draws.tolist()) == {3, 0}
    np.testing.assert_allclose(np.mean(draws == 3), 0.4 / 0.7, atol=0.04)


def test_sampling_stays_inside_the_nucleus(key):
    draws = draw(key, 4000, top_p=0.71)
    assert set(draws.tolist()) == {3, 0, 4}
    np.testing.assert_allclose(np.mean(draws == 4), 0.15 / 0.85, atol=0.03)


def test_unfiltered_sampling_follows_the_distribution(key):
    draws = draw(key, 4000)
    frequencies = np.bincount(draws, minlength=5) / draws.size
    np.testing.assert_allclose(frequencies, PROBS, atol=0.03)


def test_same_key_same_draw_and_greedy_is_argmax(key):
    values = SamplingSettings(temperature=0.7, top_k=3).values()
    first = choose_token(LOGITS, key, values)
    again = choose_token(LOGITS, key, values)
    assert int(first) == int(again)
    assert int(choose_token(LOGITS, None, None)) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), r"temperature must be a finite number >= 0.*got nan"),
        (dict(temperature=float("inf")), "temperature must be a finite number"),
        (dict(temperature=1.0, top_p=float("nan")), "top_p"),
        (dict(temperature=1.0, top_k=0), "top_k"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=1.5), "top_p"),
    ],
)
def test_bad_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**kwargs)


@pytest.mark.parametrize("filters", [dict(top_k=5), dict(top_p=0.9), dict(top_k=5, top_p=0.9)])
def test_filters_with_greedy_decoding_are_refused(filters):
    # before: accepted, and argmax ignored them without a word
    name, value = next(iter(filters.items()))
    message = (
        f"{name}={value} only acts when sampling: pass a temperature above 0 (temperature=0 is "
        f"greedy), or drop {name}"
    )
    with pytest.raises(ValueError) as error:
        SamplingSettings(temperature=0.0, **filters)
    assert str(error.value) == message


def test_sampling_without_a_key_raises():
    with pytest.raises(ValueError, match="key"):
        SamplingSettings(temperature=1.0).check_key(None)
    SamplingSettings(temperature=0.0).check_key(None)  # greedy needs none
