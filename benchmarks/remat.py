"""How much does recomputing in the backward pass (`remat`) change a train step on this device?

    python benchmarks/remat.py
    python benchmarks/remat.py --presets gpt-small translator-small --batch 16 --seq 64

`TransformerConfig.remat` wraps each layer in `jax.checkpoint`: None keeps every intermediate
for the backward pass, "dots" keeps only the matrix products and recomputes the elementwise
work (norms, activations, softmax), "full" keeps only each layer's input and recomputes the
layer. Recomputing costs arithmetic and saves memory traffic: on a CPU the saved intermediates
are written into and read back from per-layer stacks, which can cost more than recomputing
them. This times the trainer's step of each preset with each setting, in interleaved rounds,
in one process; the presets' `remat` defaults were chosen from its results.

Writes `benchmarks/results/remat-<date>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zoo.bench.hardware import device_info, peak_bf16
from zoo.bench.report import now_utc
from zoo.bench.run_zoo import ZooRun
from zoo.bench.suite import write_script_results
from zoo.bench.timing import interleave
from zoo.bench.workload import REMAT_MODES, BenchSpec
from zoo.host import tune_host_allocator

RESULTS = Path(__file__).resolve().parent / "results"
CPU_PRESETS = [
    "gpt-tiny",
    "classifier-tiny",
    "translator-tiny",
    "gpt-small",
    "classifier-small",
    "translator-small",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=CPU_PRESETS)
    parser.add_argument("--modes", nargs="+", default=list(REMAT_MODES), choices=REMAT_MODES)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    tune_host_allocator()  # as `zoo bench` and `zoo train` run
    date = now_utc()
    device = device_info()
    peak = peak_bf16(device["device_kind"], device["platform"])
    rows = []
    for preset in args.presets:
        runs = {}
        for mode in args.modes:
            spec = BenchSpec(
                preset=preset,
                batch=args.batch,
                seq=args.seq,
                precision=args.precision,
                remat=mode,
                decode_tokens=0,
            )
            runs[mode] = ZooRun(spec, peak)
            runs[mode].train.start(warmup=2)
        interleave([run.train for run in runs.values()], steps=args.steps, rounds=args.rounds)
        step_ms = {mode: 1e3 * run.train.median_s for mode, run in runs.items()}
        fastest = min(step_ms, key=step_ms.__getitem__)
        row = {
            "preset": preset,
            "batch": args.batch,
            "seq": args.seq,
            "precision": args.precision,
            "step_ms": step_ms,
            "speedup_vs_none": {mode: step_ms["none"] / ms for mode, ms in step_ms.items()}
            if "none" in step_ms
            else None,
            "fastest": fastest,
        }
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    argv = sys.argv[1:] if argv is None else argv
    path = write_script_results("remat", rows, date, argv, args.out)
    header = "".join(f"{mode + ' ms':>11}" for mode in args.modes)
    print(f"{'preset':<18}{'batch x seq':>12}{header}  fastest")
    for row in rows:
        cells = "".join(f"{row['step_ms'][mode]:>11.2f}" for mode in args.modes)
        shape = f"{row['batch']}x{row['seq']}"
        print(f"{row['preset']:<18}{shape:>12}{cells}  {row['fastest']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
