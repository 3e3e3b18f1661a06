"""Full fine-tuning vs LoRA on a pretrained `gpt-small` (run on purpose, not a test).

`python benchmarks/lora_finetune.py [--pretrain 300] [--adapt 150]` trains `gpt-small` on the
first half of tiny_shakespeare (characters), then adapts it to the second half three ways: full
fine-tuning, LoRA rank 8 on the attention projections, and the same LoRA on an int8 base. It
prints JSON: trainable parameters, optimizer-state bytes, seconds per step (after compilation)
and the validation loss (nats per character, the last 10% of the second half).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

import zoo
from zoo.data.packing import RandomBlocks, packed_batches
from zoo.data.tokenizers.char import CharTokenizer
from zoo.train.checkpoint import state_arrays
from zoo.train.step import make_train_step

TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tiny_shakespeare" / "input.txt"
BLOCK, BATCH = 128, 8


def train(model, optimizer, stream, steps: int, seed: int):
    """`steps` updates on random blocks of `stream`; the model, opt state and seconds per step."""
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer)
    blocks = RandomBlocks(stream, block_size=BLOCK, batch_size=BATCH, seed=seed)
    key = jax.random.key(seed)
    model, state, out = step(model, state, blocks.batch(0), key, 0)  # compiles
    jax.block_until_ready(out)
    started = time.perf_counter()
    for index in range(1, steps):
        model, state, out = step(model, state, blocks.batch(index), key, index)
    jax.block_until_ready(out)
    return model, state, (time.perf_counter() - started) / max(1, steps - 1)


def validation_loss(model, stream, pad_id: int, limit: int) -> float:
    batches = packed_batches(stream, block_size=BLOCK, batch_size=BATCH, pad_id=pad_id,
                             shuffle=False, drop_last=False, split_name="validation")  # fmt: skip
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-3))
    return round(float(trainer.evaluate(model, batches, limit=limit)["loss"]), 5)


def logit_gap(model, other, stream) -> dict[str, float]:
    """Largest |logit difference| of two models on the first validation block, and the scale."""
    tokens = stream[None, :BLOCK]
    reference = np.asarray(jax.vmap(model)(tokens))
    gap = np.abs(np.asarray(jax.vmap(other)(tokens)) - reference).max()
    return {
        "max_logit_diff": round(float(gap), 5),
        "max_logit": round(float(abs(reference).max()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", default=str(TEXT))
    parser.add_argument("--pretrain", type=int, default=300)
    parser.add_argument("--adapt", type=int, default=150)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-batches", type=int, default=20)
    args = parser.parse_args()
    text = Path(args.text).read_text(encoding="utf-8")
    tokenizer = CharTokenizer.from_corpus([text])
    stream = np.asarray(tokenizer.encode(text), np.int32)
    half = len(stream) // 2
    first, second = stream[:half], stream[half:]
    cut = int(len(second) * 0.9)
    adapt_train, adapt_valid = second[:cut], second[cut:]
    pad = tokenizer.pad_id or 0

    def loss(model):
        return validation_loss(model, adapt_valid, pad, args.eval_batches)

    model = zoo.create("gpt-small", key=jax.random.key(0))
    pretrain_opt = zoo.train.adamw(
        3e-3, warmup=min(30, args.pretrain // 2), schedule="cosine", total_steps=args.pretrain
    )
    base, _, seconds = train(model, pretrain_opt, first, args.pretrain, seed=0)
    rows = [{"run": "pretrained on the first half", "steps": args.pretrain,
             "step_seconds": round(seconds, 4), "valid_loss": loss(base)}]  # fmt: skip
    int8 = zoo.lora.quantize(base)
    rows.append({"run": "pretrained, int8 base", "valid_loss": loss(int8),
                 **logit_gap(base, int8, adapt_valid)})  # fmt: skip
    lora_key = jax.random.key(1)
    runs = {
        "full fine-tuning": (base, zoo.train.adamw(args.lr)),
        "LoRA r=8 attention": (
            zoo.lora.apply(base, rank=8, alpha=16, targets="attention", key=lora_key),
            zoo.lora.only_adapters(zoo.train.adamw(args.lr)),
        ),
        "LoRA r=8 attention, int8 base": (
            zoo.lora.quantize(zoo.lora.apply(base, rank=8, alpha=16, key=lora_key)),
            zoo.lora.only_adapters(zoo.train.adamw(args.lr)),
        ),
    }
    for name, (start, optimizer) in runs.items():
        start = jax.tree_util.tree_map(lambda x: x.copy() if eqx.is_array(x) else x, start)
        trained, state, seconds = train(start, optimizer, adapt_train, args.adapt, seed=1)
        lora = zoo.lora.has_lora(trained)
        params = zoo.lora.adapter_arrays(trained) if lora else eqx.filter(trained, eqx.is_array)
        arrays = zoo.serialize.named_arrays(trained)
        rows.append({
            "run": name,
            "steps": args.adapt,
            "trainable_params": sum(a.size for a in jax.tree_util.tree_leaves(params)),
            "model_bytes": sum(a.nbytes for a in arrays.values()),
            "optimizer_bytes": sum(a.nbytes for a in state_arrays(state).values()),
            "step_seconds": round(seconds, 4),
            "valid_loss": loss(trained),
        })  # fmt: skip
    meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "load": os.getloadavg(),
            "batch": BATCH, "block": BLOCK, "lr": args.lr, "eval_batches": args.eval_batches}  # fmt: skip
    print(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
