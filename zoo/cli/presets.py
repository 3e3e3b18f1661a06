"""`zoo presets`: every preset with its flavor and parameter count."""

from __future__ import annotations

import argparse
import json


def register(commands) -> None:
    parser = commands.add_parser("presets", help="list model presets with parameter counts")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.set_defaults(run=run)


def rows() -> list[dict]:
    from zoo.presets import get, names, param_count

    out = []
    for name in names():
        preset = get(name)
        c = preset.config
        out.append(
            dict(
                name=name,
                flavor=preset.flavor,
                params=param_count(name),
                d_model=c.d_model,
                layers=c.num_layers,
                heads=c.num_heads,
                kv_heads=c.kv_heads,
                vocab=c.vocab_size,
                description=preset.description,
            )
        )
    return out


def run(args: argparse.Namespace) -> int:
    table = rows()
    if args.json:
        for row in table:
            print(json.dumps(row))
        return 0
    header = (
        f"{'preset':<18} {'flavor':<11} {'params':>15} {'d_model':>7} {'layers':>6} {'heads':>5} "
        f"{'kv':>3}"
    )
    print(header)
    print("-" * len(header))
    for r in table:
        print(
            f"{r['name']:<18} {r['flavor']:<11} {r['params']:>15,} {r['d_model']:>7} "
            f"{r['layers']:>6} {r['heads']:>5} {r['kv_heads']:>3}  {r['description']}"
        )
    return 0
