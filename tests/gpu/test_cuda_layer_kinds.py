"""Local and global layers, and soft-capping, in the CUDA program, lowered on the CPU.

A Gemma 3-style stack (five windowed layers to one global one, as data beside the weights)
lowers to cuDNN calls with the window as cuDNN's own sliding window on the local layers and
none on the global ones, scanned (`lax.cond` between the two kinds) or unrolled, in the bf16
train step's forward and backward. Gemma 2's attention soft-capping is no option of a fused
kernel: its attention runs zoo's explicit softmax, and the log says so once.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest
from cuda_program import cuda_text, fused_calls, lowering_unavailable, separate_traces

import zoo
from zoo.nn import kernel
from zoo.train import cast_floating

reason = lowering_unavailable()
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))

BATCH, SEQ = 2, 32


@pytest.fixture(scope="module", autouse=True)
def traces_of_this_module_only():
    with separate_traces():
        yield


@pytest.fixture(autouse=True)
def fresh_log():
    kernel._said.clear()
    yield
    kernel._said.clear()


def tokens(vocab: int) -> jnp.ndarray:
    return 3 + jnp.arange(BATCH * (SEQ + 1), dtype=jnp.int32).reshape(BATCH, -1) % (vocab - 3)


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_local_layers_get_cudnns_window_and_global_layers_none(layer_loop, caplog):
    model = zoo.create(
        "gemma-3-tiny", key=jax.random.key(0), layer_loop=layer_loop, pad_id=None, remat=None
    )
    task = zoo.tasks.for_flavor("gpt")
    trainer = zoo.Trainer(task, precision="bf16")
    state = trainer.init_optimizer(model)

    def step(model, state, batch, key):
        return trainer.train_step(model, state, batch, key, 1)

    batch = {"tokens": tokens(model.config.vocab_size)}
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        text = cuda_text(step, model, state, batch, jax.random.key(1))
    calls = fused_calls(text)
    windows = {(call.backward, call.sliding_window) for call in calls}
    # window 8 on the local layers, none on the global one; forward and backward of each
    assert windows == {(False, 8), (False, 0), (True, 8), (True, 0)}
    assert {call.mask_type for call in calls} == {"CAUSAL"}
    if layer_loop == "unroll":  # 7 layers: 6 local, 1 global, one forward call each
        forward = [call.sliding_window for call in calls if not call.backward]
        assert sorted(forward) == [0] + [8] * 6
    assert not caplog.records, [record.getMessage() for record in caplog.records]


def test_soft_capped_attention_runs_the_explicit_softmax_and_says_so(caplog):
    model = cast_floating(
        zoo.create("gemma-2-tiny", key=jax.random.key(0), pad_id=None), jnp.bfloat16
    )
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        text = cuda_text(lambda m, t: jax.vmap(m)(t), model, tokens(model.config.vocab_size))
    assert fused_calls(text) == []
    messages = [record.getMessage() for record in caplog.records]
    assert any("soft-capping" in message for message in messages), messages
    # without the soft-cap the same model's attention is cuDNN's
    uncapped = cast_floating(
        zoo.create(
            "gemma-2-tiny", key=jax.random.key(0), pad_id=None, **{"attention.softcap": None}
        ),
        jnp.bfloat16,
    )
    text = cuda_text(lambda m, t: jax.vmap(m)(t), uncapped, tokens(uncapped.config.vocab_size))
    assert {call.sliding_window for call in fused_calls(text)} == {0, 8}


@pytest.mark.parametrize(
    ("preset", "windows"), [("olmo3-tiny", [0, 8, 8, 8]), ("smollm3-tiny", [0, 0, 0, 0])]
)
def test_olmo3_and_smollm3_layers_reach_cudnn_with_their_windows(preset, windows, caplog):
    """OLMo 3's sliding layers get cuDNN's window and its full layer (its own YaRN rotary) none;
    SmolLM3's NoPE layer runs the same fused call as its rotary ones: one per layer."""
    model = cast_floating(
        zoo.create(preset, key=jax.random.key(0), layer_loop="unroll", pad_id=None),
        jnp.bfloat16,
    )
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        text = cuda_text(lambda m, t: jax.vmap(m)(t), model, tokens(model.config.vocab_size))
    calls = fused_calls(text)
    assert sorted(call.sliding_window for call in calls if not call.backward) == windows
    assert not caplog.records, [record.getMessage() for record in caplog.records]
