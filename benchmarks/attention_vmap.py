"""Does per-example attention under `jax.vmap` cost anything against batched attention?

    python benchmarks/attention_vmap.py
    python benchmarks/attention_vmap.py --shapes 16,64,4,16 --steps 50

zoo's attention (`zoo.nn.attention.dot_product_attention`) takes one example,
`[seq, heads, head_dim]`, and the models are batched with `jax.vmap`. This compares, forward and
forward + backward, with a causal mask:

- `vmap`: zoo's per-example attention under `jax.vmap` (what the models run);
- `batched`: the same computation written on `[batch, seq, heads, head_dim]` by hand
  (`jax.nn.dot_product_attention` with a `[1, 1, seq, seq]` mask and the same zeroing of fully
  masked rows);
- `batched_causal`: `jax.nn.dot_product_attention(..., is_causal=True)`, no mask array;
- `einsum`: scores, masked softmax and the weighted sum as plain batched einsums.

Each variant is checked against `vmap` (largest absolute difference), and the operations of its
optimised HLO are counted: the computation (dots, exponentials, reductions, ...) apart from the
data movement (copies, transposes) that layouts cost. Writes `benchmarks/results/attention_vmap-<date>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zoo.bench.report import now_utc
from zoo.bench.suite import write_script_results
from zoo.nn import Mask
from zoo.nn.attention import dot_product_attention

RESULTS = Path(__file__).resolve().parent / "results"


def variants(mask: jax.Array) -> dict:
    """Attention functions `(q, k, v) [batch, seq, heads, head_dim] -> same shape`."""

    def vmapped(q, k, v):
        return jax.vmap(lambda q, k, v: dot_product_attention(q, k, v, mask)[0])(q, k, v)

    def batched(q, k, v):
        out = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None])
        any_key = jnp.any(mask, axis=-1)
        return jnp.where(any_key[None, :, None, None], out, jnp.zeros_like(out))

    def batched_causal(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    def einsum(q, k, v):
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v)

    return {"vmap": vmapped, "batched": batched, "batched_causal": batched_causal, "einsum": einsum}


def with_backward(attend):
    """Forward + backward: gradients of a scalar of the output with respect to q, k and v."""
    return jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) ** 2), argnums=(0, 1, 2))


# Operations that only move or relabel data; the rest is the computation itself.
LAYOUT_OPS = ("copy", "transpose")
PLUMBING_OPS = ("bitcast", "parameter", "constant", "broadcast", "tuple", "get-tuple-element")


def hlo_ops(compiled) -> collections.Counter:
    """How often each operation occurs in the optimised HLO (fusion bodies included)."""
    counts: collections.Counter = collections.Counter()
    for line in compiled.as_text().splitlines():
        match = re.match(r"\s*(?:ROOT )?%[\w.\-]+ = \S+ ([\w\-]+)\(", line)
        if match:
            counts[match.group(1)] += 1
    return counts


def compute_ops(counts: collections.Counter) -> dict[str, int]:
    skip = LAYOUT_OPS + PLUMBING_OPS
    return {op: n for op, n in sorted(counts.items()) if op not in skip}


def interleaved_medians(programs: dict, args, steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per program, timed in `rounds` rounds that visit every program in turn.

    On a shared machine the load changes over seconds; interleaving lets every variant see the
    same load instead of one variant getting a quiet minute and the next a busy one.
    """
    for compiled in programs.values():
        jax.block_until_ready(compiled(*args))
    samples: dict = {name: [] for name in programs}
    for _ in range(rounds):
        for name, compiled in programs.items():
            for _ in range(steps):
                start = time.perf_counter()
                jax.block_until_ready(compiled(*args))
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def measure(shape: tuple[int, int, int, int], steps: int, rounds: int) -> list[dict]:
    batch, seq, heads, head_dim = shape
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
    mask = Mask(causal=True).array(seq, seq)
    programs, outputs = {}, {}
    for name, attend in variants(mask).items():
        for pass_name, fn in (("forward", attend), ("forward+backward", with_backward(attend))):
            compiled = jax.jit(fn).lower(q, k, v).compile()
            programs[(name, pass_name)] = compiled
            outputs[(name, pass_name)] = compiled(q, k, v)
    medians = interleaved_medians(programs, (q, k, v), steps, rounds)
    rows = []
    for (name, pass_name), compiled in programs.items():
        ours, reference = outputs[(name, pass_name)], outputs[("vmap", pass_name)]
        difference = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference))
        )
        counts = hlo_ops(compiled)
        reference_ops = compute_ops(hlo_ops(programs[("vmap", pass_name)]))
        row = {
            "shape": dict(batch=batch, seq=seq, heads=heads, head_dim=head_dim),
            "variant": name,
            "pass": pass_name,
            "median_ms": 1e3 * medians[(name, pass_name)],
            "max_abs_diff_vs_vmap": difference,
            "compute_ops": compute_ops(counts),
            "layout_ops": sum(counts[op] for op in LAYOUT_OPS),
        }
        row["same_compute_ops_as_vmap"] = row["compute_ops"] == reference_ops
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["16,64,4,16", "8,256,12,64"],
        help="batch,seq,heads,head_dim (default: gpt-tiny and gpt2 heads)",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds over all variants")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    date = now_utc()
    rows = []
    for text in args.shapes:
        shape = tuple(int(part) for part in text.split(","))
        if len(shape) != 4:
            parser.error(f"--shapes takes batch,seq,heads,head_dim; got {text!r}")
        rows += measure(shape, args.steps, args.rounds)  # type: ignore[arg-type]
    argv = sys.argv[1:] if argv is None else argv
    path = write_script_results("attention_vmap", rows, date, argv, args.out)
    print(
        f"{'shape (b,s,h,d)':<16} {'variant':<15} {'pass':<17} {'ms':>9} "
        f"{'same compute ops':>16} {'copies+transposes':>17}"
    )
    for row in rows:
        shape = ",".join(str(value) for value in row["shape"].values())
        print(
            f"{shape:<16} {row['variant']:<15} {row['pass']:<17} {row['median_ms']:>9.3f} "
            f"{row['same_compute_ops_as_vmap']!s:>16} {row['layout_ops']:>17}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
