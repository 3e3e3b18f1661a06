"""The MoE row of `benchmarks/gpu.sh` (OLMoE-1B-7B's widths, 2 layers, bf16, 8 x 1024) lowered
for CUDA on the CPU from shapes alone (`cuda_program.py`): zoo bench's own train step runs the
experts as grouped matmuls (`ragged_dot`) over the batch's 65,536 routed rows, its dense
reference runs none, and both call cuDNN's fused attention (causal, with the
padding mask OLMoE's pad id asks for)."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from cuda_program import cuda_text, kinds, lowering_unavailable, separate_traces

from zoo import presets, tasks
from zoo.bench.workload import BenchSpec
from zoo.train import adamw
from zoo.train.step import make_train_step

reason = lowering_unavailable()
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))

BATCH, SEQ, LAYERS = 8, 1024, 2  # the gpu.sh row


@pytest.fixture(scope="module", autouse=True)
def traces_of_this_module_only():
    with separate_traces():
        yield


def lowered_step(moe_path: str) -> tuple[str, object]:
    spec = BenchSpec(preset="olmoe-1b-7b", batch=BATCH, seq=SEQ, precision="bf16",
                     attention="cudnn", num_layers=LAYERS, moe_path=moe_path)  # fmt: skip
    config = spec.config()
    optimizer = adamw(lr=1e-4)

    def build():
        model = presets.build(config, key=jax.random.key(0))
        return model, optimizer.init(eqx.filter(model, eqx.is_inexact_array))

    model, opt_state = eqx.filter_eval_shape(build)  # shapes only: nothing is allocated
    step = make_train_step(tasks.for_flavor("gpt"), optimizer, precision="bf16")
    batch = {"tokens": jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)}

    def train(model, opt_state, batch, key):
        return step(model, opt_state, batch, key, 1)

    return cuda_text(train, model, opt_state, batch, jax.random.key(1)), config


def test_the_ragged_path_multiplies_the_routed_rows_with_grouped_matmuls():
    text, config = lowered_step("ragged")
    grouped = re.findall(r"chlo\.ragged_dot[^\n]*", text)
    # gate, up and down per layer forward, each with two products in the backward
    assert len(grouped) >= 3 * 3 * LAYERS, len(grouped)
    rows = BATCH * SEQ * config.experts().top_k  # 65,536 rows of top-8 routing
    assert any(f"tensor<{rows}x2048xbf16>" in line for line in grouped), grouped[:3]
    assert kinds(text) == {("forward", "PADDING_CAUSAL"), ("backward", "PADDING_CAUSAL")}


def test_the_dense_reference_runs_every_expert_without_grouped_matmuls():
    text, config = lowered_step("dense")
    assert "ragged_dot" not in text
    # every token through all 64 experts: [batch, experts, seq, width] hidden activations
    assert f"tensor<{BATCH}x{config.experts().num_experts}x{SEQ}x1024xbf16>" in text
    assert kinds(text) == {("forward", "PADDING_CAUSAL"), ("backward", "PADDING_CAUSAL")}
