"""Trainable-state bytes and step time: full fine-tuning vs LoRA (run on purpose, not a test).

`python benchmarks/lora_memory.py [--steps N] [--preset gpt-small]` prints JSON: for `gpt2`
shapes (nothing trained, shapes only) the bytes of the model, its trained part and AdamW
state, full vs LoRA rank 8 on attention vs the same LoRA on an int8 base; then, for `--preset`
(random weights), the same three ways each trained `--steps` steps in its own process: seconds
per step after compilation and the process's peak resident memory (`--steps 0`: shapes only).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

import equinox as eqx
import jax
import numpy as np

import zoo
from zoo.train.step import make_train_step


def _bytes(tree) -> int:
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(tree))


def state_bytes(preset: str, lora: bool, int8: bool = False) -> dict[str, int]:
    """Model, trained-parameter and optimizer-state bytes, from shapes alone.

    `model_bytes` counts every array (an int8 base's weights and scales too); `param_bytes` the
    floating ones, which are what the optimizer is given.
    """

    optimizer = zoo.train.adamw(1e-4)
    if lora:
        optimizer = zoo.lora.only_adapters(optimizer)

    def build():  # traced by eval_shape: no memory for the weights
        model = zoo.create(preset, key=jax.random.key(0))
        if lora:
            model = zoo.lora.apply(
                model, rank=8, alpha=16, targets="attention", key=jax.random.key(1)
            )
        if int8:
            model = zoo.lora.quantize(model, "int8")
        arrays = eqx.filter(model, eqx.is_array)
        params = eqx.filter(model, eqx.is_inexact_array)
        trained = zoo.lora.adapter_arrays(model) if lora else params
        with jax.numpy_dtype_promotion("standard"):
            return arrays, params, trained, optimizer.init(params)

    arrays, params, trained, opt_state = jax.eval_shape(build)
    return {
        "model_bytes": _bytes(arrays),
        "param_bytes": _bytes(params),
        "trained_bytes": _bytes(trained),
        "optimizer_bytes": _bytes(opt_state),
    }


def step_seconds(preset: str, lora: bool, int8: bool, steps: int, batch: int, seq: int) -> dict:
    """Seconds per training step after compilation, and this process's peak resident bytes."""
    model = zoo.create(preset, key=jax.random.key(0))
    optimizer = zoo.train.adamw(1e-4)
    if lora:
        model = zoo.lora.apply(model, rank=8, alpha=16, targets="attention", key=jax.random.key(1))
        optimizer = zoo.lora.only_adapters(optimizer)
    if int8:
        model = zoo.lora.quantize(model, "int8")
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer)
    vocab = model.config.vocab_size
    tokens = jax.random.randint(jax.random.key(2), (batch, seq), 3, vocab)
    key = jax.random.key(3)
    model, opt_state, out = step(model, opt_state, {"tokens": tokens}, key, 0)  # compile
    jax.block_until_ready(out)
    started = time.perf_counter()
    for index in range(1, steps + 1):
        model, opt_state, out = step(model, opt_state, {"tokens": tokens}, key, index)
    jax.block_until_ready(out)
    return {
        "step_seconds": round((time.perf_counter() - started) / steps, 4),
        # Linux reports ru_maxrss in KiB
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def in_own_process(args: argparse.Namespace, lora: bool, int8: bool) -> dict:
    """`step_seconds` in a fresh Python process, so each peak is that run's alone."""
    command = [sys.executable, __file__, "--preset", args.preset, "--steps", str(args.steps),
               "--batch", str(args.batch), "--seq", str(args.seq),
               "--one", f"{int(lora)},{int(int8)}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gpt-small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "LORA,INT8": one run, this process
    args = parser.parse_args()
    if args.one:
        lora, int8 = (flag == "1" for flag in args.one.split(","))
        print(json.dumps(step_seconds(args.preset, lora, int8, args.steps, args.batch, args.seq)))
        return
    rows = []
    for lora, int8 in ((False, False), (True, False), (True, True)):
        rows.append({"shapes": "gpt2", "lora": lora, "int8_base": int8,
                     **state_bytes("gpt2", lora, int8)})  # fmt: skip
    for lora, int8 in ((False, False), (True, False), (True, True)) if args.steps > 0 else ():
        row = {"preset": args.preset, "lora": lora, "int8_base": int8,
               **state_bytes(args.preset, lora, int8)}  # fmt: skip
        rows.append(row | in_own_process(args, lora, int8))
    meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "machine": platform.machine(), "batch": args.batch, "seq": args.seq,
            "steps": args.steps}  # fmt: skip
    print(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
