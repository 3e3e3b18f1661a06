"""zoo's programs beside the plain-JAX floor's, op by op: what zoo's own code adds.

    python benchmarks/hlo_diff.py                          # gpt2 and bert-base, 8 x 512, bf16
    python benchmarks/hlo_diff.py --batch 16 --seq 1024 --no-compile

For three programs (the gpt2 train step, the bert-base train step, gpt2 greedy decoding), zoo's
and the floor's (`zoo.bench.floor`: the same model and math as plain JAX), this lowers each for
CUDA on this machine (no GPU needed: `zoo.bench.cuda_lowering`) and counts in the StableHLO what
a GPU would be asked to run: cuDNN attention and other custom calls, host callbacks,
conditionals and loops, transposes, dynamic slices and updates, all-reduces, converts to
float32, dots. With compiling (the default) it also compiles both for this CPU and reads XLA's
fusions, copies and memory analysis (arguments, outputs, temporaries) of the optimised program.
Prints a table per program and writes `benchmarks/results/hlo_diff-<date>-cpu.json`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from zoo import presets, tasks
from zoo.bench import floor
from zoo.bench.cuda_lowering import as_if_on_a_gpu, lowering_unavailable
from zoo.bench.report import now_utc
from zoo.bench.run_zoo import make_greedy_decode
from zoo.bench.suite import write_script_results
from zoo.bench.workload import BenchSpec, make_batch, make_prompts
from zoo.train import PRECISIONS, adamw
from zoo.train.step import make_train_step

RESULTS = Path(__file__).resolve().parent / "results"
OPS = ("custom_call", "case", "if", "while", "transpose", "dynamic_slice",
       "dynamic_update_slice", "all_reduce", "dot_general", "gather", "scatter")  # fmt: skip
OP = re.compile(r"stablehlo\.(\w+)")
TARGET = re.compile(r"custom_call @([\w$.]+)")
TO_F32 = re.compile(r"stablehlo\.convert .*-> tensor<[^>]*xf32>")
FUSION = re.compile(r"^\s*(?:ROOT )?\S+ = \S+ fusion\(", re.M)
COPY = re.compile(r"^\s*(?:ROOT )?\S+ = \S+ copy\(", re.M)


def stablehlo_counts(text: str) -> dict[str, int]:
    """What the lowered program asks of the device: op counts, custom calls by target."""
    ops = Counter(OP.findall(text))
    counts = {op: ops.get(op, 0) for op in OPS}
    targets = Counter(TARGET.findall(text))
    counts["cudnn_attention"] = sum(n for t, n in targets.items() if "fmha" in t)
    counts["host_callbacks"] = sum(n for t, n in targets.items() if "callback" in t)
    counts["other_custom_calls"] = counts["custom_call"] - counts["cudnn_attention"]
    counts["other_custom_calls"] -= counts["host_callbacks"]
    counts["converts_to_f32"] = len(TO_F32.findall(text))
    return counts


def compiled_counts(compiled: jax.stages.Compiled) -> dict[str, int | None]:
    """Fusions and copies of the optimised CPU program, and its memory analysis (bytes)."""
    text = compiled.as_text() or ""
    counts: dict[str, int | None] = {
        "cpu_fusions": len(FUSION.findall(text)),
        "cpu_copies": len(COPY.findall(text)),
    }
    stats = compiled.memory_analysis()
    for name in ("argument", "output", "temp", "alias"):
        counts[f"{name}_bytes"] = (
            None if stats is None else int(getattr(stats, f"{name}_size_in_bytes"))
        )
    return counts


Program = tuple[Any, tuple[Any, ...]]  # a function and its arguments


def programs(spec_of: dict[str, BenchSpec], new_tokens: int) -> dict[str, tuple[Program, Program]]:
    """(zoo, floor) programs by name: the train steps and greedy decoding."""
    found = {}
    for name, spec in spec_of.items():
        config = spec.config()
        compute = PRECISIONS[spec.precision]
        model = presets.build(config, key=jax.random.key(0))
        params = floor.floor_params(model)
        batch = {k: jnp.asarray(v) for k, v in make_batch(spec).items()}
        task = tasks.for_flavor(spec.flavor)
        optimizer = adamw(lr=1e-4)
        zoo_step = make_train_step(task, optimizer, precision=spec.precision, host_checks=True)
        state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
        key = jax.random.key(0)
        shape = floor.Floor.of(config)
        loss = shape.gpt2_loss if spec.flavor == "gpt" else shape.bert_loss
        floor_step, floor_init = floor.make_train_step(loss, compute, lr=1e-4)
        floor_state = floor_init(params)

        def zoo_train(model, state, batch, step=zoo_step, key=key):
            return step(model, state, batch, key, 0, checked=True)

        found[f"{name} train"] = (
            (zoo_train, (model, state, batch)),
            (floor_step, (params, floor_state, batch)),
        )
        if spec.flavor == "gpt" and new_tokens:
            prompts = jnp.asarray(make_prompts(spec))
            zoo_decode = make_greedy_decode(prompts.shape[1], new_tokens, spec.precision)
            floor_decode = jax.jit(shape.greedy_decode, static_argnums=2)

            def floor_greedy(params, prompts, decode=floor_decode, compute=compute):
                return decode(floor.cast(params, compute), prompts, new_tokens)

            found[f"{name} decode"] = (
                (zoo_decode, (model, prompts)),
                (floor_greedy, (params, prompts)),
            )
    return found


def lowered(program: Program, platform: str) -> jax.stages.Lowered:
    """The program lowered for `platform`, its arrays as arguments (not constants)."""
    function, args = program
    dynamic, static = eqx.partition(args, eqx.is_array)

    def run(dynamic):
        return eqx.filter(function(*eqx.combine(dynamic, static)), eqx.is_array)

    return jax.jit(run).trace(dynamic).lower(lowering_platforms=(platform,))


def measure(program: Program, compile_cpu: bool) -> dict[str, int | None]:
    with as_if_on_a_gpu():
        counts: dict[str, int | None] = dict(stablehlo_counts(lowered(program, "cuda").as_text()))
    jax.clear_caches()  # the CUDA trace must not be reused for the CPU
    if compile_cpu:
        with jax.numpy_dtype_promotion("standard"):
            counts.update(compiled_counts(lowered(program, "cpu").compile()))
        jax.clear_caches()
    return counts


def table(name: str, zoo: dict[str, int | None], plain: dict[str, int | None]) -> str:
    lines = [f"{name}", f"  {'':24} {'zoo':>14} {'floor':>14} {'zoo - floor':>14}"]
    for field in zoo:
        mine, theirs = zoo[field], plain[field]
        gap = "-" if mine is None or theirs is None else f"{mine - theirs:+,}"
        mark = "" if gap in ("-", "+0") else "  <"
        lines.append(f"  {field:24} {mine if mine is not None else '-':>14,} "
                     f"{theirs if theirs is not None else '-':>14,} {gap:>14}{mark}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpt", default="gpt2", help="the GPT preset (GPT-2's parts)")
    parser.add_argument("--bert", default="bert-base", help="the classifier preset (BERT's)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--decode-prompt", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--no-compile", action="store_true", help="lower only, no CPU compile")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    reason = lowering_unavailable()
    if reason:
        print(f"hlo_diff: cannot lower for CUDA here: {reason}", file=sys.stderr)
        return 1
    shapes = dict(batch=args.batch, seq=args.seq, precision=args.precision, attention="cudnn",
                  decode_prompt=args.decode_prompt, decode_tokens=args.decode_tokens,
                  steps=1, warmup=0)  # fmt: skip
    specs = {args.gpt: BenchSpec(preset=args.gpt, **shapes),
             args.bert: BenchSpec(preset=args.bert, **shapes)}  # fmt: skip
    date = now_utc()
    rows = []
    for name, (zoo_program, floor_program) in programs(specs, args.decode_tokens).items():
        print(f"hlo_diff: {name}", file=sys.stderr)
        zoo_counts = measure(zoo_program, not args.no_compile)
        floor_counts = measure(floor_program, not args.no_compile)
        print(table(f"{name} ({args.batch}x{args.seq} {args.precision})", zoo_counts, floor_counts))
        rows.append({"program": name, "batch": args.batch, "seq": args.seq,
                     "precision": args.precision, "zoo": zoo_counts, "floor": floor_counts})  # fmt: skip
    path = write_script_results("hlo_diff", rows, date, list(argv or sys.argv[1:]), args.out)
    print(f"hlo_diff: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
