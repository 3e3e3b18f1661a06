"""`zoo bench`: training, inference and decoding throughput, MFU, and a PyTorch peer."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from zoo.cli._mesh import add_mesh_option
from zoo.cli._numbers import RATE

EPILOG = """\
examples:
  zoo bench                                    every flavor at the device's default shapes
  zoo bench --flavor gpt --preset gpt2 --batch 16 --seq 1024 --precision bf16 --json
  zoo bench --peer torch                       the same work on HuggingFace transformers
  zoo bench --preset gpt2 --peer floor         the same model as plain JAX: what zoo's own
                                               code costs beyond XLA's program
  zoo bench --preset mixtral-bench --moe-path ragged,dense --peer torch
                                               both MoE paths and transformers' Mixtral

Defaults: on CPU the tiny presets at batch 16 x 64 in fp32; on a GPU gpt2 (16 x 1024),
bert-base (32 x 512) and transformer-base (64 x 128) in bf16. Results are written as JSON to
benchmarks/results/ (see --out). docs/benchmarks.md explains every number.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--flavor",
        action="append",
        choices=("gpt", "classifier", "translator"),
        help="flavor to run (repeatable; default: all three)",
    )
    what.add_argument(
        "--preset",
        action="append",
        help="preset to run (repeatable; default: the device's preset per flavor)",
    )
    what.add_argument("--batch", type=int, help="sequences per step")
    what.add_argument("--seq", type=int, help="positions per sequence")
    what.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        help="compute dtype (default: fp32 on CPU, bf16 on accelerators)",
    )
    what.add_argument(
        "--pad-vocab",
        action="store_true",
        help="round the vocabulary up to a multiple of 64 (both models)",
    )
    what.add_argument(
        "--layers",
        choices=("scan", "unroll"),
        help="run the layer stack with lax.scan or unrolled (default: the preset's)",
    )
    what.add_argument(
        "--remat",
        choices=("none", "dots", "full", "auto"),
        help="recompute in the backward: nothing, elementwise work, whole layers, or dots on a "
        "CPU and nothing elsewhere (default: the preset's)",
    )
    what.add_argument(
        "--attention",
        choices=("auto", "xla", "cudnn"),
        default="auto",
        help="attention implementation (auto: cuDNN for bf16 on a GPU, else XLA)",
    )
    what.add_argument(
        "--dropout",
        type=RATE,
        default=0.0,
        help="dropout of both models (default 0: throughput without dropout)",
    )
    what.add_argument(
        "--moe-path",
        action="append",
        metavar="PATHS",
        help="a mixture-of-experts preset runs one row per path, comma-separated: ragged "
        "(grouped matmuls, dropless), dense (every expert on every token; the reference) "
        "(default: the preset's)",
    )
    what.add_argument(
        "--num-layers",
        type=int,
        help="layers of both models, fewer than the preset's (large shapes on one device)",
    )
    what.add_argument("--decode-prompt", type=int, help="prompt length for GPT decoding")
    what.add_argument(
        "--decode-tokens",
        type=int,
        help="tokens to generate per sequence for GPT decoding (0: skip)",
    )
    add_mesh_option(what)
    how = parser.add_argument_group("how to time")
    how.add_argument("--steps", type=int, help="timed calls per measurement (median reported)")
    how.add_argument("--warmup", type=int, help="untimed calls after the compiling one")
    how.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="spread the timed calls over this many rounds, zoo and peer in turn",
    )
    how.add_argument("--seed", type=int, default=0, help="data and parameter seed")
    peer = parser.add_argument_group("peer")
    peer.add_argument(
        "--peer",
        choices=("torch", "floor"),
        action="append",
        help="also run a peer on the same work, timed in turns with zoo (repeatable): torch, "
        "HuggingFace transformers; floor, the same model as plain JAX (gpt2*, bert* presets)",
    )
    peer.add_argument(
        "--peer-compile",
        action="store_true",
        help="also time the peer under torch.compile (the faster mode is compared)",
    )
    peer.add_argument(
        "--sequential",
        action="store_true",
        help="time the peer alone and free its memory before zoo (default: in turns)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print rows as JSON lines")
    out.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="directory for the results file (default: benchmarks/results)",
    )
    out.add_argument("--no-save", action="store_true", help="do not write a results file")
    out.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="after timing, trace zoo's train step and write where its time goes to DIR "
        "(a summary by kind of work and op, the optimised HLO, the trace for Perfetto/xprof)",
    )
    out.add_argument(
        "--profile-steps", type=int, default=3, help="train steps traced by --profile (default 3)"
    )


def register(commands) -> None:
    parser = commands.add_parser(
        "bench",
        help="throughput, MFU and compile time; optionally against a PyTorch peer",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def command_line(args: argparse.Namespace) -> str:
    """`zoo bench` with the options that differ from their defaults: how to redo this run."""
    reference = argparse.ArgumentParser()
    add_arguments(reference)
    defaults = vars(reference.parse_args([]))
    words = ["zoo", "bench"]
    for name, default in defaults.items():
        value = getattr(args, name, default)
        if value == default:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [part for item in value for part in (flag, str(item))]
        else:
            words += [flag, str(value)]
    return " ".join(words)


def moe_paths(values: list[str] | None) -> list[str] | None:
    """`--moe-path ragged,dense` (repeatable) as a list of paths, in order, each once."""
    if not values:
        return None
    paths = [path.strip() for value in values for path in value.split(",") if path.strip()]
    return list(dict.fromkeys(paths))


def run(args: argparse.Namespace) -> int:
    torch_peer = "torch" in (args.peer or ())
    if torch_peer:
        # JAX would otherwise take 75% of GPU memory up front and starve the peer.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from zoo.bench import report, suite
    from zoo.bench.hardware import device_info

    platform = device_info()["platform"]
    workload = suite.Workload(
        batch=args.batch,
        seq=args.seq,
        precision=args.precision,
        attention=args.attention,
        decode_prompt=args.decode_prompt,
        decode_tokens=args.decode_tokens,
        steps=args.steps,
        warmup=args.warmup,
    )
    specs = suite.plan(
        platform,
        flavors=args.flavor,
        preset_names=args.preset,
        workload=workload,
        pad_vocab=args.pad_vocab,
        layers=args.layers,
        remat=args.remat,
        dropout=args.dropout,
        seed=args.seed,
        rounds=args.rounds,
        mesh=args.mesh,
        num_layers=args.num_layers,
        moe_paths=moe_paths(args.moe_path),
    )
    if args.profile_steps < 1:
        raise ValueError(f"--profile-steps must be >= 1, got {args.profile_steps}")
    if args.profile is not None:  # an unwritable folder fails now, before any work
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.mesh and args.peer:
        raise ValueError("--peer runs on one device: drop --mesh or --peer")
    if torch_peer:
        from zoo.bench.peer_models import import_torch

        # after checking the options (cheap), before any work: a missing torch is a one-line
        # error (zoo.cli.main)
        import_torch()
    date = report.now_utc()
    rows = []
    for index, spec in enumerate(specs):
        print(f"zoo bench: {spec.preset} {spec.batch}x{spec.seq} {spec.precision}", file=sys.stderr)
        rows.append(
            suite.run_spec(
                spec,
                peer=args.peer,
                peer_compile=args.peer_compile,
                sequential=args.sequential,
                date=date,
                first=index == 0,
                profile=args.profile,
                profile_steps=args.profile_steps,
            )
        )
    if args.json:
        for row in rows:
            print(json.dumps(row, allow_nan=False))
    else:
        print(report.table(rows))
        for line in report.notes(rows):
            print(line)
    if not args.no_save:
        meta = suite.run_meta(command_line(args), date, peer="torch" if torch_peer else None)
        path = report.write_results(args.out, rows, meta)
        print(f"zoo bench: wrote {path}", file=sys.stderr)
    return 0
