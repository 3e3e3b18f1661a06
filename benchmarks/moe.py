"""How fast is the dropless grouped-matmul path of a mixture of experts, against the dense
all-experts reference and against transformers' Mixtral, on this device?

    python benchmarks/moe.py                       # the defaults below
    python benchmarks/moe.py --batch 4 --steps 6   # any `zoo bench` option after them wins

A shorthand for

    zoo bench --preset mixtral-bench --moe-path ragged,dense --peer torch \\
        --batch 8 --seq 128 --decode-tokens 0

`mixtral-bench`: a 2-layer Mixtral-style decoder, d_model 256, 8 experts of width 512, top-2.
One row per zoo path, each timed in interleaved rounds with transformers' `MixtralForCausalLM`
on the same work; the rows give tokens/s and the compiled train step's temporaries
(`train_temp_bytes`). docs/moe.md explains the numbers; results go to benchmarks/results/.
"""

from __future__ import annotations

import sys

import zoo.cli

DEFAULTS = ["--preset", "mixtral-bench", "--moe-path", "ragged,dense", "--peer", "torch"]
DEFAULTS += ["--batch", "8", "--seq", "128", "--decode-tokens", "0"]


def main(argv: list[str] | None = None) -> int:
    return zoo.cli.main(["bench", *DEFAULTS, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
