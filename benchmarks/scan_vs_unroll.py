"""Layers run with `lax.scan` or unrolled: compile time and step time, measured.

    python benchmarks/scan_vs_unroll.py                       # gpt2 and gpt-tiny shapes
    python benchmarks/scan_vs_unroll.py --presets gpt2 --train-steps 0

For each preset, both layer modes, two programs:

- forward: a jitted, vmapped forward;
- train: the trainer's jitted step (forward, backward, AdamW); `--train-steps 0` skips it.

Compile time is read from JAX's compile events on each program's first call: `trace_lower_s`
(tracing to a jaxpr and lowering to MLIR) and `compile_s` (the XLA compile). The timed calls of
the four programs of a preset are interleaved in rounds, so a change in the machine's load hits
scan and unroll alike. Writes `benchmarks/results/scan_vs_unroll-<date>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from zoo import presets, tasks
from zoo.bench.report import now_utc
from zoo.bench.suite import write_script_results
from zoo.bench.timing import Timed, interleave
from zoo.bench.workload import BenchSpec, make_batch
from zoo.train import adamw
from zoo.train.step import make_train_step

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("scan", "unroll")


def forward_timer(spec: BenchSpec) -> Timed:
    model = presets.build(spec.config(), key=jax.random.key(0))
    tokens = jnp.asarray(make_batch(spec)["tokens"][:, :-1])
    forward = eqx.filter_jit(lambda model, tokens: jax.vmap(model)(tokens))
    return Timed(lambda _: forward(model, tokens))


def train_timer(spec: BenchSpec) -> Timed:
    model = presets.build(spec.config(), key=jax.random.key(0))
    optimizer = adamw(lr=1e-4)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(tasks.for_flavor(spec.flavor), optimizer)
    batch = {name: jnp.asarray(value) for name, value in make_batch(spec).items()}
    key, numbers = jax.random.key(0), itertools.count()

    def call(state):
        return step(state[0], state[1], batch, key, next(numbers))

    return Timed(call, (model, opt_state))


def measure(preset: str, args: argparse.Namespace) -> list[dict]:
    """Both layer modes of one preset; timed calls interleaved across the four programs."""
    timers: dict[tuple[str, str], Timed] = {}
    for mode in MODES:
        spec = BenchSpec(preset=preset, batch=args.batch, seq=args.seq, layers=mode)
        timers[(mode, "forward")] = forward_timer(spec)
        if args.train_steps > 0:
            timers[(mode, "train")] = train_timer(spec)
    for (mode, program), timer in timers.items():
        timer.start(warmup=1)
        print(f"{preset} {mode} {program}: compiled in {timer.compile_s:.1f}s", file=sys.stderr)
    forward = [timer for (_, program), timer in timers.items() if program == "forward"]
    train = [timer for (_, program), timer in timers.items() if program == "train"]
    interleave(forward, steps=args.steps, rounds=args.rounds)
    if train:
        interleave(train, steps=args.train_steps, rounds=min(args.rounds, args.train_steps))
    rows = []
    for mode in MODES:
        row = {"preset": preset, "layers": mode, "batch": args.batch, "seq": args.seq}
        for program in ("forward", "train"):
            timer = timers.get((mode, program))
            if timer is None:
                continue
            row[f"{program}_trace_lower_s"] = timer.compile_s - timer.backend_compile_s
            row[f"{program}_compile_s"] = timer.backend_compile_s
            row[f"{program}_step_s"] = timer.median_s
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["gpt2", "gpt-tiny"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed forward calls")
    parser.add_argument("--train-steps", type=int, default=4, help="timed train steps (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over scan and unroll")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    date = now_utc()
    rows = [row for preset in args.presets for row in measure(preset, args)]
    argv = sys.argv[1:] if argv is None else argv
    path = write_script_results("scan_vs_unroll", rows, date, argv, args.out)
    nan = float("nan")
    print(
        f"{'preset':<10} {'layers':<7} {'fwd trace+lower':>15} {'fwd compile':>11} "
        f"{'fwd step':>9} {'train trace+lower':>17} {'train compile':>13} {'train step':>10}"
    )
    for row in rows:
        print(
            f"{row['preset']:<10} {row['layers']:<7} {row['forward_trace_lower_s']:>14.2f}s "
            f"{row['forward_compile_s']:>10.2f}s {1e3 * row['forward_step_s']:>7.1f}ms "
            f"{row.get('train_trace_lower_s', nan):>16.2f}s "
            f"{row.get('train_compile_s', nan):>12.2f}s {1e3 * row.get('train_step_s', nan):>8.1f}ms"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
