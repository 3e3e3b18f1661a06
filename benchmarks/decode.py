"""Decode throughput: KV-cached `zoo.generate` against recomputing the whole prefix every step.

    python benchmarks/decode.py                      # gpt2 shapes, batch 1 and 64
    python benchmarks/decode.py --batch-sizes 1 --new-tokens 32 --recompute-lengths 64 95

Weights are random (throughput does not depend on them) and `eos_id` is switched off so every
sequence produces all `--new-tokens` tokens. Greedy decoding, float32.

- cached: `zoo.generate` end to end (prefill of the prompt + one compiled `lax.while_loop`),
  compilation excluded: small batches are timed on a second call; a large batch runs once and
  its time is the call minus the tracing/lowering/compile time JAX reports for that call.
- recompute: each new token needs a forward pass over the whole prefix (prompt + tokens so far).
  The baseline computes that pass with the model's own layers but projects only the last
  position onto the vocabulary, the cheapest honest recompute. A full 256-step run at batch 64
  takes far too long on a small CPU, so one step is timed at a few prefix lengths, the per-step
  time is interpolated linearly between them and summed over the prefix lengths the run would
  use. The JSON says which lengths were timed.

Writes `benchmarks/results/decode-<platform>-<date>.json` with the device, versions, command
line and machine load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import zoo
from zoo.nn import BlockInputs, Mask

RESULTS = Path(__file__).resolve().parent / "results"


def last_position_logits(model: zoo.GPT, tokens: jax.Array) -> jax.Array:
    """One uncached forward over `tokens` [seq]; logits of the last position only [vocab]."""
    num_tokens = tokens.shape[0]
    x = model.embedder(tokens, jnp.arange(num_tokens))
    x, _ = model.layers(x, BlockInputs(mask=Mask(causal=True)))
    last = x[-1:]
    if model.final_norm is not None:
        last = model.final_norm(last)
    return model.output_head(last)[0]


@eqx.filter_jit
def recompute_step(model: zoo.GPT, prefixes: jax.Array) -> jax.Array:
    """The next greedy token of every prefix [batch, seq], from scratch."""
    logits = jax.vmap(lambda tokens: last_position_logits(model, tokens))(prefixes)
    return jnp.argmax(logits, axis=-1)


def timed(function, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(function(*args))
    return time.perf_counter() - start


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_load() -> dict:
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five, "loadavg_15m": fifteen}


COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def timed_with_compile(function) -> tuple[float, float]:
    """(wall seconds, of which JAX reports tracing, lowering and XLA compilation) of one call."""
    spent = []

    def listen(event, duration, **kwargs):
        if event in COMPILE_EVENTS:
            spent.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        seconds = timed(function)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return seconds, float(sum(spent))


def bench_cached(model, prompts, new_tokens: int, second_call: bool) -> dict:
    """`zoo.generate` end to end, compilation excluded."""
    run = lambda: zoo.generate(model, prompts, max_new_tokens=new_tokens)  # noqa: E731
    first, compile_s = timed_with_compile(run)
    result = {"first_call_s": first, "compile_s": compile_s}
    if second_call:
        seconds = timed(run)
        result["timing"] = "second call (compiled)"
    else:
        seconds = first - compile_s
        result["timing"] = (
            "first call minus the tracing, lowering and compile time JAX reports for it (a "
            "second call would double a long run); this reads high: compare first_call_s - "
            "compile_s with seconds on the batches timed on a second call"
        )
    batch = prompts.shape[0]
    result.update(
        seconds=seconds,
        ms_per_step=1000 * seconds / new_tokens,
        tokens_per_s=batch * new_tokens / seconds,
    )
    return result


def bench_recompute(model, batch: int, prompt_len: int, new_tokens: int, lengths, rng) -> dict:
    timings = {}
    for length in lengths:
        prefixes = jnp.asarray(rng.integers(0, model.config.vocab_size, (batch, length)), jnp.int32)
        compiled = recompute_step.lower(model, prefixes).compile()
        seconds = timed(compiled, model, prefixes)
        if seconds < 5.0:  # short enough to time again, without first-run allocations
            seconds = timed(compiled, model, prefixes)
        timings[length] = seconds
        print(
            f"  recompute batch {batch} prefix {length}: {timings[length]:.3f} s/step", flush=True
        )
    measured = np.array(sorted(timings), float)
    seconds = np.array([timings[int(n)] for n in measured])
    used = np.arange(prompt_len, prompt_len + new_tokens, dtype=float)  # prefix per step
    if measured[0] > used[0] or measured[-1] < used[-1]:
        raise ValueError(
            f"--recompute-lengths must span the prefixes used, {int(used[0])} to {int(used[-1])}"
        )
    per_step = np.interp(used, measured, seconds)
    total = float(per_step.sum())
    return {
        "timed_prefix_lengths": [int(n) for n in measured],
        "timed_seconds_per_step": [float(s) for s in seconds],
        "estimated_seconds": total,
        "estimated_tokens_per_s": batch * new_tokens / total,
        "method": "one step timed per listed prefix length (compiled ahead; steps under 5 s "
        "timed a second time); "
        "per-step time interpolated linearly in the prefix length and summed over the "
        f"{new_tokens} steps (prefix {prompt_len}..{prompt_len + new_tokens - 1})",
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument(
        "--recompute-lengths",
        type=int,
        nargs="+",
        default=None,
        help="prefix lengths at which one recompute step is timed (default: first, middle, last)",
    )
    parser.add_argument(
        "--second-call-up-to",
        type=int,
        default=8,
        help="batch sizes up to this run zoo.generate twice and time the second call",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    last = args.prompt_len + args.new_tokens - 1
    lengths = args.recompute_lengths or [args.prompt_len, (args.prompt_len + last) // 2, last]
    load_before = machine_load()
    started = time.perf_counter()
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    model = zoo.create(args.preset, key=jax.random.key(0), eos_id=None)
    rng = np.random.default_rng(0)

    # The lean recompute must agree with the model's own forward pass.
    probe = jnp.asarray(rng.integers(0, model.config.vocab_size, (16,)), jnp.int32)
    reference = eqx.filter_jit(lambda m, t: m(t)[-1])(model, probe)
    lean = eqx.filter_jit(last_position_logits)(model, probe)
    np.testing.assert_allclose(lean, reference, atol=1e-4)

    runs = []
    for batch in args.batch_sizes:
        vocab = model.config.vocab_size
        prompts = jnp.asarray(rng.integers(0, vocab, (batch, args.prompt_len)), jnp.int32)
        cached = bench_cached(model, prompts, args.new_tokens, batch <= args.second_call_up_to)
        print(f"cached batch {batch}: {cached['tokens_per_s']:.1f} tokens/s", flush=True)
        recompute = bench_recompute(model, batch, args.prompt_len, args.new_tokens, lengths, rng)
        speedup = recompute["estimated_seconds"] / cached["seconds"]
        print(
            f"recompute batch {batch}: {recompute['estimated_tokens_per_s']:.1f} tokens/s "
            f"(estimated); cached is {speedup:.1f}x faster",
            flush=True,
        )
        runs.append(
            {"batch": batch, "cached": cached, "recompute": recompute, "cached_speedup": speedup}
        )

    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - started
    cpu = (usage_after.ru_utime - usage_before.ru_utime) + (
        usage_after.ru_stime - usage_before.ru_stime
    )
    device = jax.devices()[0]
    today = dt.date.today().isoformat()
    result = {
        "benchmark": "decode",
        "date": today,
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "device": {
            "platform": device.platform,
            "device_kind": device.device_kind,
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
        },
        "versions": {
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "equinox": eqx.__version__,
            "python": platform.python_version(),
            "zoo": zoo.__version__,
        },
        "setup": {
            "preset": args.preset,
            "params": zoo.count_params(model),
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "decoding": "greedy",
            "dtype": model.config.dtype,
            "weights": "random",
            "eos": "disabled (every sequence runs all steps)",
        },
        "machine_load": {
            "before": load_before,
            "after": machine_load(),
            "wall_s": wall,
            "process_cpu_s": cpu,
            "note": "load averages above the core count mean other work shared "
            "the CPU; timings are then pessimistic for both methods",
        },
        "runs": runs,
    }
    out = args.out or RESULTS / f"decode-{device.platform}-{today}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
