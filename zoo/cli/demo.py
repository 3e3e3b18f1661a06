"""`zoo demo`: the offline showcase. Trains every flavor on a built-in task and prints a table."""

from __future__ import annotations

import argparse
import json
import sys
import time


def register(commands) -> None:
    from zoo.demo import FLAVOR_ORDER

    parser = commands.add_parser(
        "demo", help="train each flavor on a built-in synthetic task (offline, a few minutes)"
    )
    parser.add_argument(
        "--flavor", choices=(*FLAVOR_ORDER, "all"), default="all", help="run one flavor only"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON row per flavor")
    parser.add_argument("--steps", type=int, default=None, help="override the steps per flavor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="save each trained model to OUT/FLAVOR")
    parser.add_argument("--examples", type=int, default=5, help="held-out examples to print")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.demo import FLAVOR_ORDER, format_table, run_flavor

    flavors = FLAVOR_ORDER if args.flavor == "all" else (args.flavor,)
    # With --json, stdout carries only the JSON rows; the narration goes to stderr.
    stream = sys.stderr if args.json else sys.stdout

    def echo(line: str) -> None:
        print(line, file=stream, flush=True)

    started = time.perf_counter()
    rows = []
    for flavor in flavors:
        out_dir = None if args.out is None else f"{args.out}/{flavor}"
        rows.append(
            run_flavor(
                flavor,
                steps=args.steps,
                seed=args.seed,
                out_dir=out_dir,
                progress=not args.no_progress,
                examples=args.examples,
                echo=echo,
            )
        )
    total = time.perf_counter() - started
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print()
        print(format_table(rows))
        print(f"total {total:.1f}s")
    return 0
