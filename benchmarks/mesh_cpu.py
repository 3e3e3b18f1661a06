"""Training steps on 8 forced CPU devices under a few meshes, against one device.

    python benchmarks/mesh_cpu.py
    python benchmarks/mesh_cpu.py --preset gpt-small --steps 10 --batch 32 --seq 64

Sets `XLA_FLAGS=--xla_force_host_platform_device_count=8` before JAX starts (unless the
device count is already in XLA_FLAGS). The 8 "devices" are threads sharing this machine's
cores, so the times are for the record, not a speed claim: they show what the collectives cost
when nothing runs in parallel. For each mesh: the median time of a train step after
compilation, and the largest difference in loss (over the steps) and in any weight (after
them) against the same steps on one device from the same weights and batches.

Writes `benchmarks/results/mesh_cpu-<date>-cpu.json`.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

import zoo
from zoo.bench.report import now_utc
from zoo.bench.suite import write_script_results
from zoo.serialize import named_arrays

RESULTS = Path(__file__).resolve().parent / "results"
MESHES = ("data=8", "fsdp=8", "data=2,fsdp=2,tensor=2")


def run(preset: str, mesh: str | None, batches: list[dict], seed: int) -> dict:
    """Train one step per batch; the seconds of each step, the losses and final weights."""
    loop = zoo.train.LoopSettings(progress=False)
    trainer = zoo.Trainer(
        zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-3, warmup=1), loop=loop, mesh=mesh
    )
    model = zoo.create(preset, key=jax.random.key(seed))
    if trainer.layout is not None:
        model = trainer.layout.place(model)
    state = trainer.init_optimizer(model)
    key, seconds, losses = jax.random.key(seed + 1), [], []
    for index, batch in enumerate(batches, start=1):
        start = time.perf_counter()
        model, state, output = trainer.train_step(model, state, batch, key, index)
        jax.block_until_ready((model, state))
        seconds.append(time.perf_counter() - start)
        losses.append(float(output.stats.loss))
    weights = {name: np.asarray(value) for name, value in named_arrays(model).items()}
    return {"seconds": seconds, "losses": losses, "weights": weights}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt-tiny")
    parser.add_argument("--steps", type=int, default=6, help="steps timed after the first")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if jax.device_count() != 8:
        raise SystemExit(f"needs 8 devices, JAX sees {jax.device_count()}: start it afresh")
    date = now_utc()
    vocab = zoo.presets.config(args.preset).vocab_size
    rng = np.random.default_rng(0)
    batches = [
        {"tokens": rng.integers(3, vocab, (args.batch, args.seq)).astype(np.int32)}
        for _ in range(args.steps + 1)
    ]
    one = run(args.preset, None, batches, seed=0)
    rows = []
    for mesh in (None, *MESHES):
        result = one if mesh is None else run(args.preset, mesh, batches, seed=0)
        row = {
            "preset": args.preset,
            "mesh": mesh or "one device",
            "batch": args.batch,
            "seq": args.seq,
            "steps_timed": args.steps,
            "compile_and_first_step_s": result["seconds"][0],
            "step_ms": 1e3 * statistics.median(result["seconds"][1:]),
            "max_loss_difference": float(
                np.max(np.abs(np.subtract(result["losses"], one["losses"])))
            ),
            "max_weight_difference": max(
                float(np.max(np.abs(result["weights"][name] - value)))
                for name, value in one["weights"].items()
            ),
            "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        }
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    path = write_script_results(
        "mesh_cpu", rows, date, sys.argv[1:] if argv is None else argv, args.out
    )
    print(f"{'mesh':<24} {'step ms':>9} {'vs one':>7} {'loss diff':>10} {'weight diff':>12}")
    for row in rows:
        print(
            f"{row['mesh']:<24} {row['step_ms']:>9.1f} {row['step_ms'] / rows[0]['step_ms']:>6.2f}x "
            f"{row['max_loss_difference']:>10.1e} {row['max_weight_difference']:>12.1e}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
