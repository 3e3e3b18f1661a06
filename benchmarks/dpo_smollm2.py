"""DPO with LoRA on the real SmolLM2-135M-Instruct (the PyPI GGUF), before and after, one script.

`python benchmarks/dpo_smollm2.py [--steps 40] [--batch 4] [--eval 200]` (the `gguf` extra; run
on purpose, never in CI). Preference pairs from `../shared/data/rotten_tomatoes`: the user asks
"Classify this review as positive or negative: ...", the chosen reply is the right one-word
label (`positive` / `negative`), the rejected one the wrong label. Each step is a command as a
user types it:

- `zoo train gpt --init SmolLM2.gguf --objective dpo --lora rank=8,alpha=16,targets=attention`
  (the reference: the base with the adapters off);
- `zoo eval MODEL --data json:PAIRS --split validation --objective simpo`, on
  the base and on the trained run: reference-free, so both are on one scale; its
  `rewards/accuracies` is the share of `--eval` held-out pairs whose right label has the higher
  log-probability (label accuracy). The trained run's DPO metrics on those pairs (against the
  base) come from its own evaluation at its last step (what `zoo eval RUN` prints again:
  tests/cli/test_preference_cli.py);
- the greedy reply to the same held-out reviews through `zoo.decoding.chat.replies` (the path
  of `zoo chat`), scored as task accuracy.

Reported: seconds per step, the training command's wall time and peak resident memory
(`/usr/bin/time -v`), and the numbers above before and after. Writes
`benchmarks/results/dpo_smollm2-DATE-cpu.json` with the versions and the load average at the
start (the machine may be shared: compare quiet runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from finetune_peer import LABELS, QUESTION, greedy_replies, reviews, score, timed_command
from smollm2_checkpoint import gguf_file

RESULTS = Path(__file__).resolve().parent / "results"
PREFERENCE = ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected",
              "logps/chosen", "logps/rejected")  # fmt: skip


def write_pairs(folder: Path, eval_count: int) -> Path:
    """`train.jsonl` and `validation.jsonl` of conversational preference rows (zoo's `json:DIR`):
    the user's question, the right label chosen, the wrong one rejected."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, limit in (("train", None), ("validation", eval_count)):
        with (folder / f"{split}.jsonl").open("w") as out:
            for row in reviews(split, limit):
                right, wrong = LABELS[row["label"]], LABELS[1 - row["label"]]
                pair = {"prompt": [{"role": "user", "content": QUESTION + row["text"]}],
                        "chosen": [{"role": "assistant", "content": right}],
                        "rejected": [{"role": "assistant", "content": wrong}]}  # fmt: skip
                out.write(json.dumps(pair) + "\n")
    return folder


def zoo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "zoo", *args]


def ranking_eval(model: str, pairs: Path, args: argparse.Namespace) -> dict:
    """`zoo eval --objective simpo` on the held-out pairs: reference-free, so the
    base and the trained run are measured on one scale. Its `rewards/accuracies` is the share of
    pairs whose right label has the higher (per-token) log-probability: the accuracy of choosing
    between the two labels."""
    done = timed_command(zoo_command("eval", model, "--data", f"json:{pairs}", "--split",
                                     "validation", "--objective", "simpo", "--beta", "1",
                                     "--max-len", str(args.max_len),
                                     "--batch-size", "8", "--json"))  # fmt: skip
    result = json.loads(done["stdout"].strip().splitlines()[-1])
    return {"pairs": result["pairs"], "label_accuracy": result["rewards/accuracies"],
            "logps/chosen": result["logps/chosen"], "logps/rejected": result["logps/rejected"],
            "wall_seconds": round(done["wall"], 1)}  # fmt: skip


def train(args: argparse.Namespace, base: Path, pairs: Path, out: Path) -> dict:
    command = zoo_command("train", "gpt", "--init", str(base), "--data", f"json:{pairs}",
                          "--objective", "dpo", "--beta", str(args.beta),
                          "--lora", f"rank={args.rank},alpha={2 * args.rank},targets=attention",
                          "--steps", str(args.steps), "--batch-size", str(args.batch),
                          "--lr", str(args.lr), "--schedule", "constant", "--warmup", "0",
                          "--weight-decay", "0", "--max-len", str(args.max_len),
                          "--precision", "fp32", "--eval-every", "100000", "--log-every", "1",
                          "--no-progress", "--json", "--out", str(out))  # fmt: skip
    done = timed_command(command)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    logged = [row for row in rows if row["split"] == "train"]
    steps = [row for row in logged if row.get("tokens_per_s")]  # the first holds the compile
    per_step = sum(row["tokens"] / row["tokens_per_s"] for row in steps) / len(steps)
    first, last = logged[0], logged[-1]
    final = [row for row in rows if row["split"] == "eval"][-1]
    held_out = {name: final["metrics"][name] for name in PREFERENCE if name in final["metrics"]}
    return {"seconds_per_step": round(per_step, 3), "wall_seconds": round(done["wall"], 1),
            "held_out": {"loss": final["loss"], **held_out},
            "peak_rss_mb": done["peak_rss_mb"], "first_loss": first["loss"],
            "last_loss": last["loss"],
            "last_train_accuracy": last["metrics"].get("rewards/accuracies")}  # fmt: skip


def task_accuracy(model_path: str, count: int) -> dict:
    """Greedy one-word replies to `count` held-out reviews, through `zoo chat`'s `replies`."""
    import zoo

    if model_path.endswith(".gguf"):
        model, tokenizer = zoo.from_pretrained(model_path, return_tokenizer=True)
    else:
        from zoo.data.tokenizers.base import load_tokenizer

        model, tokenizer = zoo.load(model_path), load_tokenizer(model_path)
    said, rows = greedy_replies(model, tokenizer, count)
    return score(said, rows) | {"first_replies": said[:5]}


def measured_accuracy(model: str, count: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", model, "--eval", str(count)],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def versions() -> dict:
    import importlib.metadata as metadata

    names = ("jax", "jaxlib", "equinox", "optax", "gguf", "tokenizers")
    return {name: metadata.version(name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4, help="pairs per step")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--eval", type=int, default=200, help="held-out pairs and reviews")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. the machine)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return print(json.dumps(task_accuracy(args.worker, args.eval)))
    load_average = os.getloadavg()
    base = gguf_file()
    result: dict = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": "cpu", "cpus": os.cpu_count(), "machine": platform.machine(),
        "load_average_at_start": [round(value, 2) for value in load_average],
        "checkpoint": base.name, "steps": args.steps, "batch_pairs": args.batch,
        "lr": args.lr, "beta": args.beta, "rank": args.rank, "max_len": args.max_len,
        "eval_pairs_and_reviews": args.eval, "note": args.note, "versions": versions()}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        pairs = write_pairs(Path(scratch) / "pairs", args.eval)
        run = Path(scratch) / "dpo-run"
        result["before"] = {"ranking": ranking_eval(str(base), pairs, args),
                            "task": measured_accuracy(str(base), args.eval)}  # fmt: skip
        print("before", json.dumps(result["before"]), file=sys.stderr)
        result["train"] = train(args, base, pairs, run)
        print("train", json.dumps(result["train"]), file=sys.stderr)
        result["after"] = {"preference": result["train"].pop("held_out"),
                           "ranking": ranking_eval(str(run), pairs, args),
                           "task": measured_accuracy(str(run), args.eval)}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    path = RESULTS / f"dpo_smollm2-{stamp}-cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({side: result[side] for side in ("before", "train", "after")}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
