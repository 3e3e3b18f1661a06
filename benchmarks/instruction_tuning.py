"""Instruction tuning on rotten_tomatoes, answers read back through zoo.chat (run on purpose).

`python benchmarks/instruction_tuning.py [--epochs 3] [--quick]` turns each review of
`../shared/data/rotten_tomatoes` into a conversation, the user asking "Classify this review as
positive or negative: ..." and the assistant answering `positive` or `negative`, and trains one
small Llama-shaped decoder from scratch (word vocabulary, zoo's default chat template) three
ways for the same number of epochs and conversations per step:

- `assistant, packed`: the loss on the assistant's tokens, conversations packed into rows;
- `all tokens, packed`: the loss on every token (no assistant-only mask);
- `assistant, one per row`: the assistant mask, each conversation padded to a bucket.

Each model then answers every validation review through `zoo.decoding.chat.replies` (batched
`zoo.chat`, greedy): the accuracy counts answers equal to the label word. Throughput is real
(non-padding) tokens per second of training after compilation, and the trainer's positions per
second (padding included). Writes `benchmarks/results/instruction_tuning-DATE.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import datasets
import equinox as eqx
import jax
import numpy as np

import zoo
from zoo.data.chat.batches import chat_batches, encode_conversations
from zoo.data.chat.datasets import chat_data
from zoo.data.chat.options import ChatDataConfig
from zoo.decoding.chat import replies

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "rotten_tomatoes"
RESULTS = Path(__file__).resolve().parent / "results"
QUESTION = "Classify this review as positive or negative: "
LABELS = ("negative", "positive")
MAX_LEN = 127  # the model reads 127 positions: every review fits
CONVERSATIONS_PER_STEP = 32
MODEL = dict(d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, d_ff=384,
             max_positions=MAX_LEN + 1)  # fmt: skip
TOKENIZER_OPTIONS = {"min_freq": 2, "lowercase": True}
LR = 1e-3
RUNS = {
    "assistant, packed": {"train_on": "assistant", "pack": True},
    "all tokens, packed": {"train_on": "all", "pack": True},
    "assistant, one per row": {"train_on": "assistant", "pack": False},
}


def conversation(row: dict) -> dict:
    return {
        "messages": [
            {"role": "user", "content": QUESTION + row["text"]},
            {"role": "assistant", "content": LABELS[row["label"]]},
        ]
    }


def load(limit: int | None) -> datasets.DatasetDict:
    splits = {}
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()]
        rows = rows[:limit] if limit else rows
        splits[split] = datasets.Dataset.from_list([conversation(row) for row in rows])
    return datasets.DatasetDict(splits)


def run(name: str, dataset, settings: dict, epochs: int, seed: int) -> dict:
    """Train one way, then answer every validation question through zoo.chat."""
    probe = chat_data(dataset, tokenizer="word", config=ChatDataConfig(
        tokenizer_options=TOKENIZER_OPTIONS, max_len=MAX_LEN, batch_size=1, **settings))  # fmt: skip
    tokenizer, counts = probe.tokenizer, probe.counts["train"]
    rows = len(probe.train)  # packed rows or conversations, batch_size 1
    per_row = counts["conversations"] / rows
    batch_size = max(1, round(CONVERSATIONS_PER_STEP / per_row))
    examples = encode_conversations(
        [row["messages"] for row in dataset["train"]], tokenizer, train_on=settings["train_on"],
        max_len=MAX_LEN,
    )  # fmt: skip
    batching = ChatDataConfig(batch_size=batch_size, max_len=MAX_LEN, pack=settings["pack"],
                              seed=seed)  # fmt: skip
    train = chat_batches(examples, pad_id=tokenizer.pad_id, config=batching)
    steps = epochs * len(train)
    model = zoo.create("llama-tiny", key=jax.random.key(seed), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                       eos_id=tokenizer.eos_id, **MODEL)  # fmt: skip
    optimizer = zoo.train.adamw(LR, warmup=steps // 20, schedule="cosine", total_steps=steps,
                                weight_decay=0.01)  # fmt: skip
    loop = zoo.train.LoopSettings(log_every=50, progress=False)
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), optimizer, loop=loop)
    started = time.perf_counter()
    model, history = trainer.fit(model, train, steps=steps, key=jax.random.key(seed + 1))
    wall = time.perf_counter() - started
    summary = history.summary
    train_seconds = summary["wall_seconds"] - summary["compile_seconds"]
    epoch = [train.batch(step)["tokens"] for step in range(len(train))]
    real_per_epoch = sum(int((tokens != tokenizer.pad_id).sum()) for tokens in epoch)
    positions_per_epoch = sum(tokens.size for tokens in epoch)
    # Throughput after every shape has compiled: the log rows after the first (a new bucket
    # length compiles the step again, within the first rows of one-per-row training).
    later = history.split("train")[1:] or history.split("train")
    seconds = sum(row["tokens"] / row["tokens_per_s"] for row in later if row["tokens_per_s"])
    steady = sum(row["tokens"] for row in later if row["tokens_per_s"]) / seconds
    validation = [row["messages"] for row in dataset["validation"]]
    model = eqx.nn.inference_mode(model)
    started = time.perf_counter()
    answers = []
    for start in range(0, len(validation), 64):
        chunk = [messages[:1] for messages in validation[start : start + 64]]
        answers += replies(model, tokenizer, chunk, max_new_tokens=3)
    answer_seconds = time.perf_counter() - started
    expected = [messages[1]["content"] for messages in validation]
    said = [answer.text.strip() for answer in answers]
    correct = sum(a == b for a, b in zip(said, expected, strict=True))
    # the batched answers are those of zoo.chat one conversation at a time
    for index in range(3):
        alone = zoo.chat(model, tokenizer, validation[index][:1], max_new_tokens=3).strip()
        assert alone == said[index], (alone, said[index])
    return {
        "name": name,
        **settings,
        "epochs": epochs,
        "steps": steps,
        "batch_size": batch_size,
        "conversations_per_row": round(per_row, 2),
        "train_conversations": counts["conversations"],
        "train_tokens_per_epoch": counts["tokens"],
        "trained_tokens_per_epoch": counts["trained_tokens"],
        "padding_share": round(1 - real_per_epoch / positions_per_epoch, 4),
        "trainer_tokens_per_s": summary["tokens_per_s"],
        "steady_positions_per_s": round(steady, 1),
        "real_tokens_per_s": round(steady * real_per_epoch / positions_per_epoch, 1),
        "conversations_per_s": round(
            steady * counts["conversations"] / positions_per_epoch * len(train) * batch_size / rows,
            1,
        ),
        "train_seconds": round(train_seconds, 1),
        "compile_seconds": summary["compile_seconds"],
        "wall_seconds": round(wall, 1),
        "final_train_loss": history.losses()[-1],
        "validation_accuracy": round(correct / len(expected), 4),
        "validation_answers": len(expected),
        "answers_not_a_label": sum(answer not in LABELS for answer in said),
        "answer_seconds": round(answer_seconds, 1),
        "vocab_size": tokenizer.vocab_size,
        "params": zoo.count_params(model),
    }


LAYOUTS = {  # throughput only: how the same conversations fill the rows
    "packed": {"pack": True},
    "one per row, bucketed": {"pack": False},
    "one per row, padded to max_len": {"pack": False, "buckets": [MAX_LEN]},
}


def throughput(dataset, steps: int, repeats: int, seed: int) -> list[dict]:
    """Training speed alone, `steps` steps per layout, the layouts alternated `repeats` times:
    the median over log intervals (of 20 steps) after the first, which holds the compiles."""
    data = chat_data(dataset, tokenizer="word", config=ChatDataConfig(
        tokenizer_options=TOKENIZER_OPTIONS, max_len=MAX_LEN, batch_size=1))  # fmt: skip
    tokenizer = data.tokenizer
    examples = encode_conversations([row["messages"] for row in dataset["train"]], tokenizer,
                                    max_len=MAX_LEN)  # fmt: skip
    model = zoo.create("llama-tiny", key=jax.random.key(seed), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                       eos_id=tokenizer.eos_id, **MODEL)  # fmt: skip
    results = []
    for repeat in range(repeats):
        for name, layout in LAYOUTS.items():
            per_row = 1.0
            if layout["pack"]:
                one = ChatDataConfig(batch_size=1, max_len=MAX_LEN)
                rows = len(chat_batches(examples, pad_id=0, config=one))
                per_row = len(examples) / rows
            batch_size = max(1, round(CONVERSATIONS_PER_STEP / per_row))
            batching = ChatDataConfig(batch_size=batch_size, max_len=MAX_LEN, seed=seed,
                                      **layout)  # fmt: skip
            source = chat_batches(examples, pad_id=tokenizer.pad_id, config=batching)
            batches = [source.batch(step)["tokens"] for step in range(steps)]
            real = sum(int((tokens != tokenizer.pad_id).sum()) for tokens in batches)
            positions = sum(tokens.size for tokens in batches)
            loop = zoo.train.LoopSettings(log_every=20, progress=False)
            trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(LR), loop=loop)
            _, history = trainer.fit(model, source, steps=steps, key=jax.random.key(seed))
            rates = [row["tokens_per_s"] for row in history.split("train")[1:]]
            rate = float(np.median([r for r in rates if r]))
            results.append({
                "layout": name, "repeat": repeat, "steps": steps, "batch_size": batch_size,
                "padding_share": round(1 - real / positions, 4),
                "positions_per_s": round(rate, 1),
                "real_tokens_per_s": round(rate * real / positions, 1),
                "conversations_per_s": round(rate * real / positions / examples.total_tokens
                                             * len(examples), 1),
                "load": os.getloadavg()[0],
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="400 reviews, 1 epoch: a smoke run")
    parser.add_argument("--only", choices=list(RUNS), action="append")
    parser.add_argument(
        "--throughput", type=int, metavar="STEPS", help="time each row layout STEPS steps instead"
    )
    args = parser.parse_args()
    dataset = load(400 if args.quick else None)
    epochs = 1 if args.quick else args.epochs
    results = []
    if args.throughput:
        speeds = throughput(dataset, args.throughput, repeats=2, seed=args.seed)
        out = RESULTS / f"instruction_tuning_throughput-{datetime.date.today().isoformat()}.json"
        record = {"command": f"python benchmarks/instruction_tuning.py --throughput "
                             f"{args.throughput}", "model": MODEL, "runs": speeds,
                  "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}  # fmt: skip
        if not args.quick:
            out.write_text(json.dumps(record, indent=2) + "\n")
            print(f"wrote {out}")
        return
    for name, settings in RUNS.items():
        if args.only and name not in args.only:
            continue
        result = run(name, dataset, settings, epochs, args.seed)
        print(json.dumps(result), flush=True)
        results.append(result)
    record = {
        "benchmark": "instruction_tuning",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/instruction_tuning.py"
        + (" --quick" if args.quick else f" --epochs {epochs}"),
        "model": {"base": "llama-tiny", **MODEL},
        "training": {
            "lr": LR,
            "schedule": "cosine",
            "warmup": "steps / 20",
            "weight_decay": 0.01,
            "tokenizer": {"kind": "word", **TOKENIZER_OPTIONS},
        },
        "data": "rotten_tomatoes (../shared/data), train 8530 / validation 1066",
        "conversations_per_step": CONVERSATIONS_PER_STEP,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "load_at_end": os.getloadavg(),
            "device": str(jax.devices()[0]),
        },
        "versions": {
            "jax": jax.__version__,
            "equinox": eqx.__version__,
            "zoo": zoo.__version__,
        },
        "runs": results,
    }
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"instruction_tuning-{datetime.date.today().isoformat()}.json"
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
