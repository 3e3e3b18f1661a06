"""A bf16 training run of `gpt-tiny` tracks the float32 run over 200 steps.

Both runs start from the same weights and see the same batches through the trainer's own step
(`zoo.train.step.make_train_step`: float32 master weights, the forward and backward in the
compute dtype, the loss in float32). The task is learnable (each sequence counts up by its own
stride, modulo the vocabulary), so the loss falls from ln(64) = 4.16 and bf16 must follow it.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_checks import requires_cudnn, requires_gpu

from zoo import presets, tasks
from zoo.train import adamw
from zoo.train.step import make_train_step

pytestmark = [pytest.mark.gpu, requires_gpu]

STEPS, BATCH, SEQ, WINDOW = 200, 16, 64, 20
# The stated tolerance: over every window of 20 steps, the mean bf16 loss is within 0.05 nats
# plus 5% of the mean float32 loss (bf16 rounds weights and activations to 8 bits of mantissa;
# both runs must learn: the float32 run ends below half its first loss).
# On the CPU the largest gap was 0.02 nats (window means 3.17 -> 0.46).
ABSOLUTE, RELATIVE = 0.05, 0.05


def counting_batches(vocab: int) -> list[dict[str, np.ndarray]]:
    """`STEPS` batches of sequences `start, start + stride, ...` modulo `vocab`."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        start = rng.integers(0, vocab, (BATCH, 1))
        stride = rng.integers(1, 8, (BATCH, 1))
        batches.append({"tokens": ((start + stride * np.arange(SEQ + 1)) % vocab).astype(np.int32)})
    return batches


@functools.cache
def losses(precision: str, attention: str | None = None) -> np.ndarray:
    model = presets.create("gpt-tiny", attention_implementation=attention, key=jax.random.key(0))
    optimizer = adamw(lr=3e-3)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(tasks.for_flavor("gpt"), optimizer, precision=precision)
    found = []
    for index, batch in enumerate(counting_batches(model.config.vocab_size)):
        model, opt_state, out = step(model, opt_state, batch, jax.random.key(1), index)
        found.append(out.stats.loss)
    return np.asarray(jnp.stack(found), np.float64)


@pytest.mark.parametrize("attention", [None, pytest.param("cudnn", marks=requires_cudnn)])
def test_bf16_loss_tracks_fp32_over_200_steps(attention):
    """bf16 with the default (XLA) attention, and with cuDNN's as `zoo bench` runs on a GPU."""
    fp32, bf16 = losses("fp32"), losses("bf16", attention)
    assert np.all(np.isfinite(bf16))
    assert fp32[0] == pytest.approx(np.log(64), abs=0.3)
    assert fp32[-WINDOW:].mean() < 0.5 * fp32[0], "the float32 run did not learn"
    windows_fp32 = fp32.reshape(-1, WINDOW).mean(axis=1)
    windows_bf16 = bf16.reshape(-1, WINDOW).mean(axis=1)
    gap = np.abs(windows_bf16 - windows_fp32)
    allowed = ABSOLUTE + RELATIVE * windows_fp32
    assert np.all(gap <= allowed), (
        f"bf16 left the float32 curve: window means fp32 {np.round(windows_fp32, 3)}, "
        f"bf16 {np.round(windows_bf16, 3)}"
    )
