"""A mixture-of-experts GPT's CUDA program, traced and lowered on the CPU (`cuda_program.py`):
the bf16 train step multiplies the experts with grouped matmuls (`ragged_dot`, forward and
backward) over the whole batch's rows, and runs cuDNN's fused attention."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_program import cuda_text, kinds, lowering_unavailable, separate_traces

import zoo

reason = lowering_unavailable()
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))

BATCH, SEQ = 4, 32


@pytest.fixture(scope="module", autouse=True)
def traces_of_this_module_only():
    with separate_traces():
        yield


def test_the_bf16_train_step_runs_grouped_matmuls_and_cudnn():
    model = zoo.create("mixtral-tiny", key=jax.random.key(0), remat=None)
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), precision="bf16")
    state = trainer.init_optimizer(model)
    lengths = np.array([SEQ + 1, SEQ - 4, SEQ // 2, 3])
    ids = 3 + np.arange(SEQ + 1)[None, :] % 60
    tokens = np.where(np.arange(SEQ + 1)[None, :] < lengths[:, None], ids, 0)
    batch = {"tokens": jnp.asarray(tokens, jnp.int32)}

    def step(model, state, batch, key):
        return trainer.train_step(model, state, batch, key, 1)

    text = cuda_text(step, model, state, batch, jax.random.key(1))
    grouped = re.findall(r"chlo\.ragged_dot[^\n]*", text)
    # 3 products per layer forward (gate, up, down), each with 2 in the backward
    assert len(grouped) >= 3 * 3 * model.config.num_layers, len(grouped)
    # the batch's rows in one call: BATCH * SEQ tokens, top-2 each, in bf16
    rows = BATCH * SEQ * model.config.experts().top_k
    assert any(f"tensor<{rows}x64xbf16>" in line for line in grouped), grouped[:3]
    assert kinds(text) == {("forward", "PADDING_CAUSAL"), ("backward", "PADDING_CAUSAL")}
