"""`zoo.bench.profile` and `zoo.bench.hlo_ops`: traces summed by hand, and a real CPU profile."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import jax
import pytest

import zoo.cli
from zoo.bench.hardware import Peak
from zoo.bench.hlo_ops import kernel_category, parse_instruction, parse_program
from zoo.bench.profile import busy_time, format_summary, module_name, op_spans, summarize

# A small optimised module in the layout XLA prints: the frame tables, fused computations, a
# loop, and an entry with one op of each kind. Frame 3 is Linear <- FeedForward <- train_step;
# frame 4 is optax's update called from train_step (a parent is printed as its number + 1).
HLO = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8,16]{1,0})->f32[]}

FileNames
1 "/home/user/zoo/train/step.py"
2 "/home/user/zoo/nn/feedforward.py"
3 "/home/user/zoo/nn/linear.py"
4 "/env/lib/python3.12/site-packages/optax/_src/transform.py"

FunctionNames
1 "train_step"
2 "FeedForward.__call__"
3 "Linear.__call__"
4 "update_moment"

FileLocations
1 {file_name_id=1 function_name_id=1 line=134 end_line=134 column=8 end_column=40}
2 {file_name_id=2 function_name_id=2 line=77 end_line=77 column=8 end_column=30}
3 {file_name_id=3 function_name_id=3 line=35 end_line=35 column=15 end_column=50}
4 {file_name_id=4 function_name_id=4 line=88 end_line=88 column=4 end_column=20}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}
4 {file_location_id=4 parent_frame_id=2}

%fused_dot (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add_region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

%fused_reduce (p0.1: f32[8,4]) -> f32[] {
  %p0.1 = f32[8,4]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %reduce.3 = f32[] reduce(%p0.1, %zero), dimensions={0,1}, to_apply=%add_region
}

%fused_copy (p0.2: f32[8,4]) -> f32[4,8] {
  %p0.2 = f32[8,4]{1,0} parameter(0)
  %transpose.4 = f32[4,8]{0,1} transpose(%p0.2), dimensions={1,0}
  ROOT %copy.5 = f32[4,8]{1,0} copy(%transpose.4)
}

%fused_add (p0.3: f32[8,4]) -> f32[8,4] {
  %p0.3 = f32[8,4]{1,0} parameter(0)
  %multiply.6 = f32[8,4]{1,0} multiply(%p0.3, %p0.3)
  ROOT %add.7 = f32[8,4]{1,0} add(%multiply.6, %p0.3)
}

%body (state: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %state = (s32[], f32[8,4]{1,0}) parameter(0)
  %index = s32[] get-tuple-element(%state), index=0
  %carry = f32[8,4]{1,0} get-tuple-element(%state), index=1
  add_fusion = f32[8,4]{1,0} fusion(%carry), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/transpose(jvp(vmap()))/mul" stack_frame_id=3}
  ROOT %next = (s32[], f32[8,4]{1,0}) tuple(%index, add_fusion)
}

%cond (state.1: (s32[], f32[8,4])) -> pred[] {
  %state.1 = (s32[], f32[8,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state.1), index=0
  %two = s32[] constant(2)
  ROOT %less = pred[] compare(%i, %two), direction=LT
}

ENTRY %main.9 (x: f32[8,16], w: f32[16,4]) -> f32[] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} parameter(1)
  %dot_fusion = f32[8,4]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(step)/jvp(vmap())/dot_general" stack_frame_id=3}
  %fmha = (bf16[2,4,8]{2,1,0}, u8[0]{0}) custom-call(%x), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"operation_queue_id":"0"}
  %all-reduce.1 = f32[8,4]{1,0} all-reduce(%dot_fusion), replica_groups={}, to_apply=%add_region
  %copy_fusion = f32[4,8]{1,0} fusion(%all-reduce.1), kind=kLoop, calls=%fused_copy
  %gather.1 = f32[2,4]{1,0} gather(%dot_fusion, %index), offset_dims={1}, slice_sizes={1,4}
  %tuple.0 = (s32[], f32[8,4]{1,0}) tuple(%zero.1, %dot_fusion)
  %while.1 = (s32[], f32[8,4]{1,0}) while(%tuple.0), condition=%cond, body=%body
  ROOT %reduce_fusion = f32[] fusion(%dot_fusion), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(step)/reduce_sum" stack_frame_id=4}
}
"""


def span(op, ts, dur, *, tid=10, module="jit_step", name=None):
    args = {"hlo_op": op, "hlo_module": module} if op else {}
    return dict(ph="X", pid=1, tid=tid, ts=ts, dur=dur, name=name or op or "?", args=args)


def host_step(start):
    """One step on two host threads: the loop's body runs twice inside `while.1`."""
    return [
        span("dot_fusion", start, 50),
        span("while.1", start + 60, 100),
        span("add_fusion", start + 70, 30),
        span("add_fusion", start + 110, 30),
        span("reduce_fusion", start, 20, tid=11),
        span(None, start, 200, name="ThunkExecutor::Execute"),  # no op: not counted
        span("dot_fusion", start + 300, 500, module="jit_other"),  # another program
    ]


HOST = [dict(ph="M", pid=1, name="process_name", args=dict(name="/host:CPU"))]
HOST += host_step(0) + host_step(1000)


def test_program_categories_phases_and_sources():
    program = parse_program(HLO)
    assert module_name(HLO) == "jit_step"
    categories = {
        name: program.category(name)
        for name in ("dot_fusion", "fmha", "all-reduce.1", "copy_fusion", "gather.1",
                     "while.1", "reduce_fusion", "add_fusion", "missing")
    }  # fmt: skip
    assert categories == {
        "dot_fusion": "matmul", "fmha": "attention", "all-reduce.1": "collective",
        "copy_fusion": "copy/layout", "gather.1": "gather/scatter", "while.1": "control",
        "reduce_fusion": "reduction", "add_fusion": "elementwise", "missing": "other",
    }  # fmt: skip
    assert program.instructions["fmha"].target == "__cudnn$fmhaSoftmax"
    assert program.instructions["while.1"].calls == ["cond", "body"]
    # frames, innermost first, through the parent links
    assert [frame[1] for frame in program.stack("dot_fusion")] == [
        "Linear.__call__", "FeedForward.__call__", "train_step"
    ]  # fmt: skip
    assert program.source("dot_fusion") == "nn/linear.py:35 < nn/feedforward.py:77"
    assert program.source("reduce_fusion") == "train/step.py:134"  # optax is not zoo
    phases = {name: program.phase(name) for name in ("dot_fusion", "add_fusion",
                                                     "reduce_fusion", "while.1")}  # fmt: skip
    assert phases == dict(dot_fusion="forward", add_fusion="backward",
                          reduce_fusion="optimizer", **{"while.1": "other"})  # fmt: skip


def test_instruction_lines_with_and_without_percent_and_inline_sources():
    line = '  ROOT %a.1 = f32[2]{0} add(%x, %y), metadata={source_file="/r/zoo/m.py" source_line=7}'
    parsed = parse_instruction(line)
    assert (parsed.name, parsed.opcode, parsed.shape, parsed.source) == (
        "a.1", "add", "f32[2]{0}", "/r/zoo/m.py:7"
    )  # fmt: skip
    tuple_shape = parse_instruction("  w = (s32[], f32[2]{0}) while(t), condition=c, body=b")
    assert (tuple_shape.opcode, tuple_shape.shape, tuple_shape.calls) == (
        "while", "(s32[], f32[2]{0})", ["c", "b"]
    )  # fmt: skip
    assert parse_instruction("HloModule m") is None and parse_instruction("  }") is None


def test_host_trace_summed_by_hand():
    spans, origin = op_spans(HOST, "jit_step")
    assert origin == "host" and len(spans) == 10  # 5 ops of jit_step per step
    summary = summarize(HOST, parse_program(HLO), "jit_step", steps=2, wall_s=[3e-4, 1e-4, 2e-4])
    # per step: dot 50, the loop's own 100 - 2 x 30 = 40, the body 2 x 30, the reduce 20 (us)
    assert summary["op_ms_per_step"] == pytest.approx(0.170)
    assert summary["busy_ms_per_step"] == pytest.approx(0.150)  # [0, 50] and [60, 160]
    assert summary["wall_ms_per_step"] == pytest.approx(0.2)  # the median
    categories = {name: slot["ms"] for name, slot in summary["categories"].items()}
    assert categories == pytest.approx(
        dict(matmul=0.050, reduction=0.020, elementwise=0.060, control=0.040)
    )
    assert list(summary["categories"]) == ["matmul", "reduction", "elementwise", "control"]
    assert sum(slot["share"] for slot in summary["categories"].values()) == pytest.approx(1.0)
    phases = {name: slot["ms"] for name, slot in summary["phases"].items()}
    assert phases == pytest.approx(dict(forward=0.05, backward=0.06, optimizer=0.02, other=0.04))
    top = summary["top"][0]
    assert (top["op"], top["ms"], top["calls_per_step"]) == ("add_fusion", 0.06, 2)
    assert top["source"] == "nn/linear.py:35 < nn/feedforward.py:77"
    table = format_summary(summary, "tiny")
    assert "matmul" in table and "add_fusion" in table and "exceed the wall time" in table
    with pytest.raises(ValueError, match="no spans of 'jit_missing'"):
        summarize(HOST, parse_program(HLO), "jit_missing", steps=1)


def test_device_trace_counts_stream_kernels_once():
    meta = [
        dict(ph="M", pid=7, name="process_name", args=dict(name="/device:GPU:0")),
        dict(ph="M", pid=7, tid=1, name="thread_name", args=dict(name="Stream #13(Compute)")),
        dict(ph="M", pid=7, tid=2, name="thread_name", args=dict(name="XLA Ops")),
        dict(ph="M", pid=8, name="process_name", args=dict(name="/host:CPU")),
    ]
    kernels = [
        ("sm90_xmma_gemm_bf16bf16_tn", "dot_fusion", 0, 40),
        ("loop_add_fusion", "add_fusion", 40, 10),
        ("loop_add_fusion", "add_fusion", 50, 10),
        ("cudnn_generated_fmha_fwd", "fmha", 60, 25),
        ("MemcpyD2H", None, 100, 5),
    ]
    events = meta + [
        dict(span(op, ts, dur, tid=1, name=name), pid=7) for name, op, ts, dur in kernels
    ]
    events.append(dict(span("dot_fusion", 0, 999, tid=2), pid=7))  # the summary line: skipped
    events.append(dict(span("dot_fusion", 0, 999, tid=3), pid=8))  # host launch: skipped
    summary = summarize(events, parse_program(HLO), "jit_step", steps=1)
    assert summary["origin"] == "device"
    categories = {name: slot["ms"] for name, slot in summary["categories"].items()}
    assert categories == pytest.approx(
        dict(matmul=0.040, attention=0.025, elementwise=0.020, memcpy=0.005)
    )
    assert summary["busy_ms_per_step"] == pytest.approx(0.090)  # [0, 85] and [100, 105]
    assert [k["kernel"] for k in summary["kernels"]][:2] == [
        "sm90_xmma_gemm_bf16bf16_tn", "cudnn_generated_fmha_fwd"
    ]  # fmt: skip
    assert summary["kernels"][2]["calls_per_step"] == 2


def test_busy_time_and_kernel_names():
    intervals = [dict(ts=0, dur=10), dict(ts=5, dur=10), dict(ts=20, dur=1), dict(ts=2, dur=3)]
    assert busy_time(intervals) == 16
    assert kernel_category("nvjet_tst_128x256_64x4") == "matmul"
    assert kernel_category("ncclDevKernel_AllReduce") == "collective"
    assert kernel_category("flash_fwd_kernel") == "attention"
    assert kernel_category("loop_fusion_3") == "other"


@pytest.mark.slow
def test_zoo_bench_profile_on_gpt_tiny(tmp_path, capsys):
    argv = ["bench", "--preset", "gpt-tiny", "--batch", "2", "--seq", "16", "--steps", "1",
            "--warmup", "0", "--rounds", "1", "--decode-tokens", "0", "--no-save", "--json",
            "--profile", str(tmp_path), "--profile-steps", "2"]  # fmt: skip
    assert zoo.cli.main(argv) == 0
    captured = capsys.readouterr()
    (row,) = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert "profile gpt-tiny 2x16 fp32: 2 traced steps" in captured.err
    summary = json.loads((tmp_path / "gpt-tiny-2x16-fp32.profile.json").read_text())
    assert row["profile"].endswith("gpt-tiny-2x16-fp32.profile.json")
    assert row["profile_categories"] == {
        name: round(slot["share"], 4) for name, slot in summary["categories"].items()
    }
    hlo = (tmp_path / summary["files"]["hlo"]).read_text()
    program = parse_program(hlo)
    assert summary["module"] == module_name(hlo) == "jit_train_step"
    with gzip.open(tmp_path / summary["files"]["trace"], "rt") as file:
        events = json.load(file)["traceEvents"]
    spans, origin = op_spans(events, "jit_train_step")
    assert origin == "host" and {span["op"] for span in spans} <= set(program.instructions)
    # the two layers run in one scan: one loop in the forward, one in the backward, per step
    loops = Counter(span["op"] for span in spans if program.category(span["op"]) == "control")
    assert len(loops) >= 2 and set(loops.values()) == {2}  # 2 traced steps
    assert {"forward", "backward", "optimizer"} <= set(summary["phases"])
    assert sum(slot["share"] for slot in summary["categories"].values()) == pytest.approx(1.0)
    matmuls = {span["op"] for span in spans if program.category(span["op"]) == "matmul"}
    sources = {program.source(op).split(" < ")[-1].split(":")[0] for op in matmuls}
    # the layers' projections (the attention's in zoo.nn.multihead) and attention products, and
    # the tied head's logits (made by the loss from the model's features: zoo.tasks.vocab_loss)
    assert sources == {
        "nn/feedforward.py",
        "nn/multihead.py",
        "nn/attention.py",
        "tasks/vocab_loss.py",
    }
    assert zoo.cli.main([*argv, "--profile-steps", "0"]) == 2
    assert "--profile-steps must be >= 1" in capsys.readouterr().err


def test_a_failed_profile_keeps_the_row(tmp_path, monkeypatch):
    import zoo.bench.profile
    from zoo.bench.suite import run_spec
    from zoo.bench.workload import BenchSpec

    def broken(*args, **kwargs):
        raise RuntimeError("no CUPTI")

    monkeypatch.setattr(zoo.bench.profile, "profile_run", broken)
    spec = BenchSpec(preset="gpt-tiny", batch=2, seq=8, steps=1, warmup=0, rounds=1,
                     decode_tokens=0)  # fmt: skip
    row = run_spec(spec, profile=tmp_path)
    assert row["tokens_per_s"] > 0 and row["profile"] is None
    assert row["profile_reason"] == "profiling failed: RuntimeError: no CUPTI"
    assert run_spec(spec)["profile_reason"] == "not asked for (--profile DIR)"


def test_a_backend_without_the_step_text_is_said(tmp_path, monkeypatch):
    """Before: TypeError: data must be str, not NoneType (writing the HLO text)."""
    from zoo.bench.profile import profile_run
    from zoo.bench.run_zoo import ZooRun
    from zoo.bench.workload import BenchSpec

    spec = BenchSpec(preset="gpt-tiny", batch=2, seq=8, decode_tokens=0)
    run = ZooRun(spec, Peak(None, None, "not measured"))
    monkeypatch.setattr(jax.stages.Compiled, "as_text", lambda self: None)
    with pytest.raises(RuntimeError, match="backend gives no text of the step"):
        profile_run(run, tmp_path, steps=1)
