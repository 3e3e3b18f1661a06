"""Which of zoo's two attention paths makes the faster train step on this device?

    python benchmarks/attention_path.py
    python benchmarks/attention_path.py --presets gpt-tiny --batch 32 --seq 128

`zoo.nn.attention.dot_product_attention` has two paths with the same result: the fused
`jax.nn.dot_product_attention` (used without dropout) and the explicit one (`attention_weights`,
a softmax of einsum scores, then an einsum with the values; used with attention dropout or when
weights are returned). This times the trainer's train step of each preset with both, in
interleaved rounds, by routing the model's calls to one path or the other for the run. It
changes nothing in zoo; it measures whether the choice of path is worth changing.

Writes `benchmarks/results/attention_path-<date>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

import zoo.nn.attention as attention
from zoo import presets, tasks
from zoo.bench.report import now_utc
from zoo.bench.suite import write_script_results
from zoo.bench.timing import Timed, interleave
from zoo.bench.workload import BenchSpec, make_batch
from zoo.nn.kernel import KernelOptions
from zoo.train import adamw
from zoo.train.step import make_train_step

RESULTS = Path(__file__).resolve().parent / "results"
FUSED = attention.dot_product_attention


def explicit_path(query, key, value, mask=None, *, return_weights=False, **call):
    """zoo's attention forced onto its explicit softmax path (same outputs)."""
    output, weights = FUSED(query, key, value, mask, return_weights=True, **call)
    return output, (weights if return_weights else None)


def fused_path(query, key, value, mask=None, *, options=None, **call):
    """zoo's attention forced onto `jax.nn.dot_product_attention` (XLA) on every device."""
    options = KernelOptions() if options is None else options
    options = options._replace(implementation=options.implementation or "xla")
    return FUSED(query, key, value, mask, options=options, **call)


@contextlib.contextmanager
def attention_path(path: str):
    """Route `MultiHeadAttention` to the "fused" or the "explicit" path while tracing."""
    attention.dot_product_attention = fused_path if path == "fused" else explicit_path
    try:
        yield
    finally:
        attention.dot_product_attention = FUSED


def train_timer(spec: BenchSpec, path: str) -> Timed:
    """The trainer's step for `spec`, traced (on its first call) with attention on `path`."""
    model = presets.build(spec.config(), key=jax.random.key(0))
    optimizer = adamw(lr=1e-4)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(tasks.for_flavor(spec.flavor), optimizer)
    batch = {name: jnp.asarray(value) for name, value in make_batch(spec).items()}
    key, numbers = jax.random.key(0), itertools.count()

    def call(state):
        model, opt_state, _ = state
        return step(model, opt_state, batch, key, next(numbers))

    timer = Timed(call, (model, opt_state, None))
    with attention_path(path):
        timer.start(warmup=2)
    return timer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--presets", nargs="+", default=["gpt-tiny", "classifier-tiny", "translator-tiny"]
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    date = now_utc()
    rows = []
    for preset in args.presets:
        spec = BenchSpec(preset=preset, batch=args.batch, seq=args.seq)
        timers = {path: train_timer(spec, path) for path in ("fused", "explicit")}
        interleave(list(timers.values()), steps=args.steps, rounds=args.rounds)
        losses = {path: float(timer.state[2].stats.loss) for path, timer in timers.items()}
        row = {
            "preset": preset,
            "batch": args.batch,
            "seq": args.seq,
            "fused_step_ms": 1e3 * timers["fused"].median_s,
            "explicit_step_ms": 1e3 * timers["explicit"].median_s,
            "explicit_speedup": timers["fused"].median_s / timers["explicit"].median_s,
            "loss_difference": abs(losses["fused"] - losses["explicit"]),
        }
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    argv = sys.argv[1:] if argv is None else argv
    path = write_script_results("attention_path", rows, date, argv, args.out)
    print(f"{'preset':<16} {'batch x seq':>11} {'fused ms':>9} {'explicit ms':>11} {'speedup':>8}")
    for row in rows:
        print(
            f"{row['preset']:<16} {row['batch']:>5}x{row['seq']:<5} {row['fused_step_ms']:>9.2f} "
            f"{row['explicit_step_ms']:>11.2f} {row['explicit_speedup']:>7.2f}x"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
