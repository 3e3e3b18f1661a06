"""Layers run with `lax.scan` or unrolled: compile time and step time, measured.

    python benchmarks/scan_vs_unroll.py                       # gpt2 and gpt-tiny shapes
    python benchmarks/scan_vs_unroll.py --presets gpt2 --train-steps 0

For each preset and layer mode:

- forward: a jitted, vmapped forward; `jit(...).lower(...)` and `.compile()` timed apart, then
  the median of `--steps` calls;
- train: the trainer's jitted step (forward, backward, AdamW); compile time from JAX's compile
  events on its first call, then the median of `--train-steps` calls (0 skips the train step).

Writes `benchmarks/results/scan_vs_unroll-<date>-<platform>.json` with the device, versions and
command line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from zoo import presets, tasks
from zoo.bench.report import now_utc
from zoo.bench.suite import run_meta
from zoo.bench.timing import time_calls
from zoo.bench.workload import BenchSpec, make_batch
from zoo.train import adamw
from zoo.train.step import make_train_step

RESULTS = Path(__file__).resolve().parent / "results"


def forward_numbers(model, tokens, steps: int) -> dict:
    """Lower and compile seconds of the batched forward, and its median run time."""
    params, static = eqx.partition(model, eqx.is_array)
    jitted = jax.jit(lambda params, tokens: jax.vmap(eqx.combine(params, static))(tokens))
    start = time.perf_counter()
    lowered = jitted.lower(params, tokens)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    jax.block_until_ready(compiled(params, tokens))
    samples = []
    for _ in range(steps):
        begin = time.perf_counter()
        jax.block_until_ready(compiled(params, tokens))
        samples.append(time.perf_counter() - begin)
    return {
        "forward_lower_s": lowered_at - start,
        "forward_compile_s": compiled_at - lowered_at,
        "forward_step_s": statistics.median(samples),
    }


def train_numbers(spec: BenchSpec, model, steps: int) -> dict:
    """Compile seconds (trace + lower + XLA) of the trainer's step and its median run time."""
    optimizer = adamw(lr=1e-4)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(tasks.for_flavor(spec.flavor), optimizer)
    batch = {name: jnp.asarray(value) for name, value in make_batch(spec).items()}
    key = jax.random.key(0)
    numbers = itertools.count()

    def call(state):
        return step(state[0], state[1], batch, key, next(numbers))

    timing, _ = time_calls(call, (model, opt_state), steps=steps, warmup=1)
    return {"train_compile_s": timing.compile_s, "train_step_s": timing.median_s}


def measure(preset: str, layers: str, batch: int, seq: int, steps: int, train_steps: int) -> dict:
    spec = BenchSpec(preset=preset, batch=batch, seq=seq, layers=layers, steps=max(steps, 1))
    model = presets.build(spec.config(), key=jax.random.key(0))
    tokens = jnp.asarray(make_batch(spec)["tokens"][:, :-1])
    row = {"preset": preset, "layers": layers, "batch": batch, "seq": seq}
    row.update(forward_numbers(model, tokens, steps))
    if train_steps > 0:
        row.update(train_numbers(spec, model, train_steps))
    print(json.dumps(row), file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["gpt2", "gpt-tiny"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed forward calls")
    parser.add_argument("--train-steps", type=int, default=3, help="timed train steps (0: none)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    date = now_utc()
    rows = [
        measure(preset, layers, args.batch, args.seq, args.steps, args.train_steps)
        for preset in args.presets
        for layers in ("scan", "unroll")
    ]
    command = "python benchmarks/scan_vs_unroll.py " + " ".join(argv or sys.argv[1:])
    meta = run_meta(command.strip(), date, peer=None)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = date.replace("-", "").replace(":", "")[:15]
    path = args.out / f"scan_vs_unroll-{stamp}-{meta['device']['platform']}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    header = f"{'preset':<10} {'layers':<7} {'fwd lower':>9} {'fwd compile':>11} {'fwd step':>9}"
    header += f" {'train compile':>13} {'train step':>10}"
    print(header)
    for row in rows:
        print(
            f"{row['preset']:<10} {row['layers']:<7} {row['forward_lower_s']:>8.2f}s "
            f"{row['forward_compile_s']:>10.2f}s {1e3 * row['forward_step_s']:>7.1f}ms "
            f"{row.get('train_compile_s', float('nan')):>12.2f}s "
            f"{1e3 * row.get('train_step_s', float('nan')):>8.1f}ms"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
