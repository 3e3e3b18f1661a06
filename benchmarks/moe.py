"""How fast is the dropless grouped-matmul path of a mixture of experts, against the dense
all-experts reference and against transformers' Mixtral, on this device?

    python benchmarks/moe.py
    python benchmarks/moe.py --batch 8 --seq 128 --d-model 256 --experts 8 --top-k 2

A Mixtral-style decoder (2 layers, `--experts` experts of width 2 * d_model, top-k) trains one
AdamW step per call: zoo with `moe_implementation="ragged"` (tokens sorted by expert, one
`jax.lax.ragged_dot` per projection), zoo with `"dense"` (every expert on every token, masked),
and transformers' `MixtralForCausalLM` (torch, one loop over the experts a batch hits), timed
in interleaved rounds in one process. Reports tokens/s and, for zoo, the compiled step's
temporary memory (XLA's `memory_analysis`).

Writes `benchmarks/results/moe-<date>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

import zoo
from zoo.bench.report import now_utc
from zoo.bench.suite import write_script_results
from zoo.bench.timing import Timed, interleave

RESULTS = Path(__file__).resolve().parent / "results"


def zoo_step(config, batch: dict, implementation: str) -> tuple[Timed, int]:
    model = zoo.GPT(config.replace(moe_implementation=implementation), key=jax.random.key(0))
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-3))
    state = (model, trainer.init_optimizer(model))
    key = jax.random.key(1)
    memory = trainer.train_step.lower(*state, batch, key).compile().compiled.memory_analysis()

    def call(state):
        model, opt_state, _ = trainer.train_step(*state, batch, key, 1)
        return model, opt_state

    return Timed(call, state), int(memory.temp_size_in_bytes)


def torch_step(config, tokens: np.ndarray) -> Timed:
    import torch
    import transformers

    from zoo.interop import to_hf

    state_dict, hf_config = to_hf(zoo.GPT(config, key=jax.random.key(0)))
    hf = transformers.MixtralForCausalLM(hf_config)
    hf.load_state_dict(state_dict, strict=False)  # the fused in-memory experts: fresh weights
    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    inputs = torch.as_tensor(tokens).long()

    def call(_):
        optimizer.zero_grad()
        loss = hf(inputs, labels=inputs).loss
        loss.backward()
        optimizer.step()
        return None

    return Timed(call, wait=lambda _: None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="skip transformers' Mixtral")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    config = zoo.presets.config(
        "mixtral-tiny",
        vocab_size=512,
        d_model=args.d_model,
        d_ff=2 * args.d_model,
        num_heads=4,
        num_kv_heads=2,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        max_positions=max(128, args.seq + 1),
        remat=None,
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 512, (args.batch, args.seq + 1)).astype(np.int32)
    batch = {"tokens": tokens}
    timers, memory = {}, {}
    for implementation in ("ragged", "dense"):
        timers[implementation], memory[implementation] = zoo_step(config, batch, implementation)
    if not args.no_torch:
        timers["transformers"] = torch_step(config, tokens)
    for timer in timers.values():
        timer.start(warmup=1)
    interleave(list(timers.values()), steps=args.steps, rounds=args.rounds)
    per_step = args.batch * args.seq
    row = {
        "model": f"mixtral-shaped, 2 layers, d_model {args.d_model}, {args.experts} experts, "
        f"top-{args.top_k}",
        "batch": args.batch,
        "seq": args.seq,
        "step_ms": {name: 1e3 * t.median_s for name, t in timers.items()},
        "tokens_per_s": {name: per_step / t.median_s for name, t in timers.items()},
        "temp_bytes": memory,
    }
    print(json.dumps(row, indent=1))
    path = write_script_results(
        "moe", [row], now_utc(), sys.argv[1:] if argv is None else argv, args.out
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
