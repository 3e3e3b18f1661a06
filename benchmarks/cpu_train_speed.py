"""Where a CPU train step of a small Llama goes, and which zoo choices make it faster.

Builds `zoo bench`'s runs (`zoo.bench.run_zoo.ZooRun`) of one preset at one shape in several
variants (layer loop, recomputation, attention path) and, with `--peer`, the PyTorch peer of the
same work, all in one process; times their train steps and forwards in interleaved rounds (so a
change in the shared machine's load hits every variant alike) and reports medians with the
load average beside them. `--profile DIR` also traces the default variant's step
(`zoo.bench.profile`) and `--hlo` counts the optimised train step's layout ops.

    python benchmarks/cpu_train_speed.py                       # smollm2-135m, 4 x 128, fp32
    python benchmarks/cpu_train_speed.py --variants default unroll --peer --rounds 5

Writes `benchmarks/results/cpu_train_speed-<UTC time>-cpu.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax

from zoo.bench.hardware import PEER_PACKAGES, ZOO_PACKAGES, Peak, versions
from zoo.bench.run_zoo import ZooRun
from zoo.bench.workload import BenchSpec
from zoo.host import tune_host_allocator

# name -> BenchSpec changes; "default" is the preset as it is
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "unroll": dict(layers="unroll"),
    "scan": dict(layers="scan"),
    "remat-dots": dict(remat="dots"),
    "remat-full": dict(remat="full"),
    "attention-xla": dict(attention="xla"),
    "attention-explicit": dict(attention="explicit"),
}
RESULTS = Path(__file__).parent / "results"


def layer_study(rounds: int, layers: int = 4) -> dict[str, Any]:
    """One SwiGLU feed-forward (smollm2-135m's widths) in a `lax.scan` of `layers` under
    `jax.vmap`, gradient of every weight at batch 4 x 128: as zoo's `Linear` writes it
    (`x @ W.T`), with the weight read by `dot_general` (no `transpose` to keep), and under
    `remat="dots"`. Returns median seconds per variant and the layer stacks each one writes."""
    import jax.numpy as jnp

    batch, seq, d_model, d_ff = 4, 128, 576, 1536
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (batch, seq, d_model))
    shapes = [(layers, d_ff, d_model), (layers, d_ff, d_model), (layers, d_model, d_ff)]
    weights = tuple(0.02 * jax.random.normal(k, shape) for k, shape in zip(keys[1:], shapes))

    def transposed(h, w):
        return h @ w.T

    def in_place(h, w):
        return jax.lax.dot_general(h, w, (((h.ndim - 1,), (1,)), ((), ())))

    def make(linear, policy=None):
        def layer(h, params):
            gate, up, down = params

            def one(h):
                return h + linear(jax.nn.silu(linear(h, gate)) * linear(h, up), down)

            return jax.vmap(one)(h), None

        if policy is not None:
            layer = jax.checkpoint(layer, policy=policy)

        def loss(params, x):
            return jnp.sum(jax.lax.scan(layer, x, params)[0] ** 2)

        return jax.jit(jax.grad(loss))

    variants = {
        "x @ W.T": make(transposed),
        "dot_general": make(in_place),
        "remat dots": make(transposed, jax.checkpoint_policies.dots_saveable),
    }
    found: dict[str, Any] = {}
    for name, step in variants.items():
        text = step.lower(weights, x).compile().as_text()
        stacks = Counter(re.findall(r"(f32\[[\d,]+\]\{[\d,]+\}) dynamic-update-slice\(", text))
        found[name] = dict(stacks=dict(stacks), samples_s=[])
    for _ in range(rounds):
        for name, step in variants.items():
            times = []
            for _ in range(3):
                start = time.perf_counter()
                jax.block_until_ready(step(weights, x))
                times.append(time.perf_counter() - start)
            found[name]["samples_s"].append(min(times))
    for entry in found.values():
        entry["median_s"] = statistics.median(entry["samples_s"])
    return found


def matmul_study(tokens: int, rounds: int) -> dict[str, Any]:
    """The train step's matrix products alone, XLA against PyTorch on the same threads: GFLOP/s
    of `[tokens, in] x [in, out]` for smollm2-135m's projection and head shapes (weights stored
    `[out, in]` and read transposed, as zoo's `Linear` and torch's `F.linear` both do), the best
    of `rounds` rounds of 10 calls each. The ceiling a step made of these products can reach."""
    import numpy as np
    import torch

    shapes = {"q/o proj": (576, 576), "k/v proj": (576, 192), "gate/up": (576, 1536),
              "down": (1536, 576), "head": (576, 49152)}  # fmt: skip
    found: dict[str, Any] = {}
    product = jax.jit(lambda x, w: x @ w.T)
    for name, (d_in, d_out) in shapes.items():
        rng = np.random.default_rng(0)
        x = rng.standard_normal((tokens, d_in), dtype=np.float32)
        w = rng.standard_normal((d_out, d_in), dtype=np.float32)
        flops = 2 * tokens * d_in * d_out
        jx, jw, tx, tw = (
            jax.numpy.asarray(x),
            jax.numpy.asarray(w),
            torch.from_numpy(x),
            torch.from_numpy(w),
        )
        jax.block_until_ready(product(jx, jw))
        torch.nn.functional.linear(tx, tw)
        best = {"xla": float("inf"), "torch": float("inf")}
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(10):
                jax.block_until_ready(product(jx, jw))
            best["xla"] = min(best["xla"], (time.perf_counter() - start) / 10)
            start = time.perf_counter()
            for _ in range(10):
                torch.nn.functional.linear(tx, tw)
            best["torch"] = min(best["torch"], (time.perf_counter() - start) / 10)
        found[name] = {
            "shape": [tokens, d_in, d_out],
            "xla_gflops": round(flops / best["xla"] / 1e9, 1),
            "torch_gflops": round(flops / best["torch"] / 1e9, 1),
        }
        found[name]["xla_over_torch"] = round(
            found[name]["xla_gflops"] / found[name]["torch_gflops"], 3
        )
    return found


def load() -> float:
    return os.getloadavg()[0]


def layout_ops(hlo_text: str) -> dict[str, Any]:
    """How many transposes, copies and dynamic-update-slices the optimised program has, and
    the bytes they write (fp32 shapes only: a rough measure of layout traffic)."""
    counts: Counter[str] = Counter()
    written: Counter[str] = Counter()
    pattern = re.compile(r"= f32\[([\d,]*)\]\{[^}]*\} (transpose|copy|dynamic-update-slice)\(")
    for match in pattern.finditer(hlo_text):
        dims, opcode = match.groups()
        size = 1
        for dim in filter(None, dims.split(",")):
            size *= int(dim)
        counts[opcode] += 1
        written[opcode] += 4 * size
    return {op: dict(count=counts[op], mbytes=round(written[op] / 2**20, 1)) for op in counts}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--variants", nargs="*", default=["default", "unroll"], choices=VARIANTS)
    parser.add_argument("--peer", action="store_true", help="time the PyTorch peer too")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after compiling")
    parser.add_argument("--no-inference", action="store_true", help="time train steps only")
    parser.add_argument("--hlo", action="store_true", help="count layout ops of each train step")
    parser.add_argument("--profile", type=Path, help="trace the first variant's step into DIR")
    parser.add_argument(
        "--layer-study", action="store_true", help="also time one SwiGLU layer's variants"
    )
    parser.add_argument(
        "--matmul-study", action="store_true",
        help="also time the step's matrix products alone, XLA against PyTorch",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if (args.peer or args.profile) and not args.variants:
        parser.error("--peer and --profile need at least one of --variants")
    tune_host_allocator()
    started = datetime.now(UTC)
    loads = [load()]
    specs = {
        name: BenchSpec(
            preset=args.preset,
            batch=args.batch,
            seq=args.seq,
            steps=args.steps,
            rounds=args.rounds,
            warmup=args.warmup,
            decode_tokens=0,
            **VARIANTS[name],
        )
        for name in args.variants
    }
    no_peak = Peak(None, None, "not measured here")
    runs: dict[str, Any] = {}
    with jax.numpy_dtype_promotion("standard"):
        for name, spec in specs.items():
            run = ZooRun(spec, no_peak)
            if args.no_inference:
                del run.timers["inference"]
            run.start()
            runs[name] = run
            print(f"{name}: compiled in {run.train.compile_s:.1f} s", file=sys.stderr)
        if args.peer:
            from zoo.bench.peer_torch import PeerRun

            first = next(iter(specs.values()))
            peer = PeerRun(first, "cpu")
            if args.no_inference:
                peer.timers = {k: v for k, v in peer.timers.items() if "train" in k}
            peer.start()
            runs["torch"] = peer
        timers = {
            (name, kind): timer for name, run in runs.items() for kind, timer in run.timers.items()
        }
        per_round = max(1, args.steps // args.rounds)
        for _ in range(args.rounds):
            loads.append(load())
            for timer in timers.values():
                timer.sample(per_round)
        loads.append(load())
    results: dict[str, Any] = {}
    for (name, kind), timer in timers.items():
        results.setdefault(name, {})[kind] = dict(
            median_s=statistics.median(timer.samples_s),
            round_medians_s=[statistics.median(times) for times in timer.rounds_s],
        )
    for name, run in runs.items():
        if name != "torch":
            results[name]["compile_s"] = run.train.compile_s
    if args.hlo:
        with jax.numpy_dtype_promotion("standard"):
            for name, run in runs.items():
                if name == "torch":
                    continue
                model, opt_state, _ = run.train.state
                compiled = run.train_step.lower(model, opt_state, run.batch, run.key).compile()
                text = getattr(compiled, "compiled", compiled).as_text()
                results[name]["layout_ops"] = layout_ops(text)
    if args.profile is not None:
        from zoo.bench.profile import format_summary, profile_run

        first_name = next(iter(specs))
        summary = profile_run(runs[first_name], args.profile, steps=2, top=25)
        print(format_summary(summary, first_name), file=sys.stderr)
        results[first_name]["profile_categories"] = {
            name: round(slot["share"], 4) for name, slot in summary["categories"].items()
        }
    if args.layer_study:
        results["layer_study"] = layer_study(args.rounds)
        for name, entry in results["layer_study"].items():
            print(f"layer study {name:>12}: {entry['median_s'] * 1e3:.0f} ms")
    if args.matmul_study:
        results["matmul_study"] = matmul_study(args.batch * args.seq, args.rounds)
        for name, entry in results["matmul_study"].items():
            print(f"matmul {name:>9} {entry['shape']}: XLA {entry['xla_gflops']} GFLOP/s, "
                  f"torch {entry['torch_gflops']} ({entry['xla_over_torch']:.2f}x)")  # fmt: skip
    record = dict(
        benchmark="cpu_train_speed",
        date=started.isoformat(timespec="seconds"),
        preset=args.preset,
        batch=args.batch,
        seq=args.seq,
        precision="fp32",
        rounds=args.rounds,
        steps=args.steps,
        load_average=loads,
        cpu_count=os.cpu_count(),
        affinity=len(os.sched_getaffinity(0)),
        xla_flags=os.environ.get("XLA_FLAGS"),
        versions=versions(*ZOO_PACKAGES, *PEER_PACKAGES),
        results=results,
    )
    for name, result in results.items():
        if name in ("layer_study", "matmul_study"):
            continue
        line = ", ".join(
            f"{kind} {value['median_s'] * 1e3:.0f} ms"
            for kind, value in result.items()
            if isinstance(value, dict) and "median_s" in value
        )
        print(f"{name:>20}: {line}")
    if "torch" in results:
        for name in specs:
            ratios = []
            for kind, value in results[name].items():
                if isinstance(value, dict) and "median_s" in value:
                    peer = results["torch"].get(f"{kind}_eager", results["torch"].get(kind))
                    if peer:
                        ratios.append(f"{kind} {peer['median_s'] / value['median_s']:.2f}x")
            print(f"{name:>20} / torch: {', '.join(ratios)}")
    print(f"load average: {loads}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%S")
    path = args.out / f"cpu_train_speed-{stamp}-cpu.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
