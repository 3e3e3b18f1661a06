"""`benchmarks/hlo_diff.py`: zoo's CUDA programs beside the floor's, lowered on this CPU. What
zoo's code once added to a step and no longer does stays out: host callbacks (the token-id
checks run on the host) and conditionals, in the train step and in decoding; and zoo's train
steps call cuDNN's attention exactly where the plain program does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zoo.bench.cuda_lowering import lowering_unavailable, separate_traces
from zoo.bench.workload import BenchSpec

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    lowering_unavailable() is not None, reason=str(lowering_unavailable())
)
SHAPES = dict(batch=2, seq=16, precision="bf16", attention="cudnn", decode_prompt=4,
              decode_tokens=4, steps=1, warmup=0, remat="none")  # fmt: skip


def load_hlo_diff():
    spec = importlib.util.spec_from_file_location("hlo_diff", ROOT / "benchmarks" / "hlo_diff.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def counts():
    hlo_diff = load_hlo_diff()
    specs = {
        "gpt-tiny": BenchSpec(preset="gpt-tiny", **SHAPES),
        "bert": BenchSpec(preset="bert-base", num_layers=2, **SHAPES),
    }
    with separate_traces():
        return {
            name: tuple(hlo_diff.measure(program, compile_cpu=False) for program in pair)
            for name, pair in hlo_diff.programs(specs, new_tokens=4).items()
        }


@pytest.mark.parametrize("program", ["gpt-tiny train", "gpt-tiny decode", "bert train"])
def test_no_host_callback_or_conditional_in_zoos_cuda_programs(counts, program):
    zoo, floor = counts[program]
    for field in ("host_callbacks", "case", "if"):
        assert zoo[field] == 0 == floor[field], (program, field, zoo[field])


@pytest.mark.parametrize("program", ["gpt-tiny train", "bert train"])
def test_zoos_train_steps_call_cudnn_where_the_floor_does(counts, program):
    zoo, floor = counts[program]
    assert zoo["cudnn_attention"] == floor["cudnn_attention"] > 0
    assert zoo["dot_general"] == floor["dot_general"]  # the same matmuls, no extra


def test_the_counts_read_a_lowered_text():
    hlo_diff = load_hlo_diff()
    text = "\n".join([
        '%0 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%a) : (tensor<2xbf16>) -> tensor<2xbf16>',
        '%1 = stablehlo.custom_call @xla_ffi_python_gpu_callback(%0) : (tensor<2xbf16>) -> ()',
        "%2 = stablehlo.convert %0 : (tensor<2xbf16>) -> tensor<2xf32>",
        "%3 = stablehlo.transpose %2, dims = [0] : (tensor<2xf32>) -> tensor<2xf32>",
    ])  # fmt: skip
    counts = hlo_diff.stablehlo_counts(text)
    assert counts["cudnn_attention"] == 1 and counts["host_callbacks"] == 1
    assert counts["other_custom_calls"] == 0 and counts["custom_call"] == 2
    assert counts["converts_to_f32"] == 1 and counts["transpose"] == 1
