"""Schedules at known steps, the weight-decay mask, AdamW's decay on exactly those arrays."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.serialize import named_arrays
from zoo.train import adamw, constant, cosine, decay_mask, inverse_sqrt, paper_peak_lr


def values(schedule, updates):
    """The schedule at update numbers 1, 2, ... (optax counts from 0)."""
    return [float(schedule(u - 1)) for u in updates]


def test_inverse_sqrt_warms_up_linearly_then_decays_as_one_over_sqrt():
    assert values(inverse_sqrt(1.0, warmup=4), [1, 2, 4, 16, 64]) == pytest.approx(
        [0.25, 0.5, 1.0, 0.5, 0.25]
    )


def test_inverse_sqrt_is_the_papers_schedule():
    d_model, warmup = 512, 4000
    schedule = inverse_sqrt(paper_peak_lr(d_model, warmup), warmup=warmup)
    for step in (1, 100, 4000, 10000, 100000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert float(schedule(step - 1)) == pytest.approx(paper, rel=1e-5)


def test_cosine_and_constant_values():
    schedule = cosine(1.0, warmup=10, total_steps=110)
    assert values(schedule, [5, 10, 60, 110, 200]) == pytest.approx(
        [0.5, 1.0, 0.5, 0.0, 0.0], abs=1e-6
    )
    assert values(constant(2.0, warmup=4), [1, 2, 4, 50]) == pytest.approx([0.5, 1.0, 2.0, 2.0])
    assert values(constant(2.0), [1, 1000]) == [2.0, 2.0]


def test_adamw_picks_its_schedule_and_rejects_bad_ones():
    assert float(adamw(1e-3).learning_rate(0)) == pytest.approx(1e-3)
    assert float(adamw(1e-3, warmup=10).learning_rate(39)) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="inverse_sqrt needs warmup >= 1"):
        adamw(1e-3, schedule="inverse_sqrt")
    with pytest.raises(ValueError, match="cosine schedule needs total_steps"):
        adamw(1e-3, schedule="cosine")
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        adamw(1e-3, schedule="linear", warmup=3)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lr": float("nan")}, "lr must be a finite number > 0, got nan"),
        ({"lr": float("inf")}, "lr must be a finite number > 0, got inf"),
        ({"lr": 0.0}, "lr must be a finite number > 0, got 0.0"),
        ({"weight_decay": -1.0}, "weight_decay must be a finite number >= 0, got -1.0"),
        ({"weight_decay": float("nan")}, "weight_decay must be a finite number >= 0, got nan"),
        ({"clip_norm": -1.0}, r"clip_norm must be a finite number > 0 \(None, or --clip-norm 0"),
        ({"clip_norm": float("inf")}, "clip_norm must be a finite number > 0"),
    ],
)
def test_adamw_refuses_numbers_that_would_train_silently_wrong(options, message):
    # NaN passes `lr <= 0`; a negative clip norm flips the gradient, a negative decay grows weights
    with pytest.raises(ValueError, match=message):
        adamw(**{"lr": 1e-3, **options})
    assert adamw(1e-3, weight_decay=0.0, clip_norm=None).settings[-1] == ("clip_norm", None)


@pytest.fixture(scope="module")
def gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(0))


def decayed_names(model) -> set[str]:
    mask = decay_mask(eqx.filter(model, eqx.is_inexact_array))
    flags = named_arrays(jax.tree_util.tree_map(jnp.asarray, mask))
    return {name for name, flag in flags.items() if bool(flag)}


def test_decay_mask_is_exactly_the_linear_weight_matrices(gpt):
    decayed = decayed_names(gpt)
    prefix = "layers.blocks."
    expected = {
        f"{prefix}self_attention.{proj}.weight"
        for proj in ("query_proj", "key_proj", "value_proj", "output_proj")
    } | {f"{prefix}feed_forward.{name}.weight" for name in ("hidden", "output")}
    assert decayed == expected
    everything = set(named_arrays(gpt))
    assert not any("bias" in name or "norm" in name or "embedder" in name for name in decayed)
    assert {"embedder.token_weight", "embedder.position_weight"} <= everything - decayed


def test_adamw_decays_only_masked_arrays(gpt):
    lr, weight_decay = 0.1, 0.5
    optimizer = adamw(lr, weight_decay=weight_decay, clip_norm=None)
    params = eqx.filter(gpt, eqx.is_inexact_array)
    state = optimizer.init(params)
    zero_grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    with jax.numpy_dtype_promotion("standard"):
        updates, _ = optimizer.update(zero_grads, state, params)
    new = named_arrays(eqx.apply_updates(params, updates))
    old = named_arrays(params)
    decayed = decayed_names(gpt)
    for name, value in new.items():
        factor = 1 - lr * weight_decay if name in decayed else 1.0
        np.testing.assert_allclose(np.asarray(value), factor * np.asarray(old[name]), rtol=1e-6)
