"""A ModernBERT-style encoder in the CUDA program, lowered on the CPU.

Its global layers run cuDNN's fused attention with the padding as lengths; its local layers'
window is two-sided, which cuDNN does not take (a left window only), so they run XLA's
attention and the log says why, once.
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


@pytest.fixture(scope="module", autouse=True)
def traces_of_this_module_only():
    with separate_traces():
        yield


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_global_layers_fuse_and_two_sided_local_layers_fall_back(layer_loop, caplog):
    kernel._said.clear()
    model = cast_floating(
        zoo.create("modernbert-tiny", key=jax.random.key(0), layer_loop=layer_loop),
        jnp.bfloat16,
    )
    tokens = 5 + jnp.arange(2 * 16, dtype=jnp.int32).reshape(2, 16) % 50
    tokens = tokens.at[1, 12:].set(model.config.pad_id)  # padding: a length
    with caplog.at_level(logging.INFO, logger="zoo.nn"):
        text = cuda_text(lambda m, t: jax.vmap(m)(t), model, tokens)
    calls = fused_calls(text)
    assert {(call.mask_type, call.sliding_window) for call in calls} == {("PADDING", 0)}
    if layer_loop == "unroll":  # layers 0 and 3 are global
        assert len(calls) == 2
    messages = [record.getMessage() for record in caplog.records]
    assert any("two-sided" in message for message in messages), messages
    kernel._said.clear()
