"""SFT, then each preference loss, on rotten_tomatoes: what the model learns (run on purpose).

`python benchmarks/dpo_learning.py [--quick]` turns rotten_tomatoes reviews into chats
("Classify this review as positive or negative: ..." -> `positive` / `negative`) and into
preference pairs (chosen: the right label, rejected: the wrong one), then runs the commands a
user runs:

1. `zoo train gpt` on the SFT chats (a small Llama-shaped decoder, word vocabulary);
2. for each of `dpo ipo hinge robust simpo orpo`: `zoo train gpt --init SFT --objective LOSS`
   on pairs of other reviews (the SFT run is the reference of the DPO family);
3. `zoo eval RUN --data PAIRS --json` on the validation pairs: the loss's own
   `rewards/accuracies` (against the SFT reference for the DPO family), and with
   `--objective simpo` the share of pairs whose chosen answer has the higher log-probability,
   which needs no reference and so compares every row and the SFT model itself;
4. task accuracy: every validation review asked through the chat path `zoo chat` uses
   (`zoo.decoding.chat.replies`, the run's chat template, greedy), the answer compared with
   the label word.

Then the reference modes of DPO, each a `zoo train` process of its own: a frozen copy of the
SFT weights, the copy's numbers precomputed, and with `--lora` the base with the adapters off
(and precomputed): training tokens/s and the process's peak RSS (GNU `time`).
`--reference-only FOLDER` measures these alone, on the data and SFT run an earlier call left
in FOLDER (it prints its temporary folder).
Writes `benchmarks/results/dpo_learning-DATE.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import equinox as eqx
import jax

import zoo
from zoo.cli import main as zoo_main
from zoo.decoding.chat import ChatFormat, chat_template, replies
from zoo.serialize import load_with_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "rotten_tomatoes"
RESULTS = Path(__file__).resolve().parent / "results"
QUESTION = "Classify this review as positive or negative: "
LABELS = ("negative", "positive")
LOSSES = ("dpo", "ipo", "hinge", "robust", "simpo", "orpo")
# β of each loss: zoo's (and TRL's) default 0.1, SimPO's paper value 2.0
BETAS = {"dpo": 0.1, "ipo": 0.1, "hinge": 0.1, "robust": 0.1, "simpo": 2.0, "orpo": 0.1}
MODEL = ["--preset", "llama-tiny", "--set", "d_model=64", "--set", "num_layers=2",
         "--set", "d_ff=192", "--tokenizer", "word", "--min-freq", "2", "--lowercase",
         "--max-len", "127"]  # fmt: skip
REFERENCE_MODES = {
    "frozen copy, on the fly": [],
    "frozen copy, precomputed": ["--precompute-reference"],
    "LoRA base, adapters off": ["--lora", "rank=8,alpha=16"],
    "LoRA base, precomputed": ["--lora", "rank=8,alpha=16", "--precompute-reference"],
}


def write_data(folder: Path, sft: int, pairs: int, held_out: int) -> None:
    """`folder/sft` (chats of the first `sft` train reviews) and `folder/pairs` (pairs of the
    next `pairs`), each with the first `held_out` validation reviews as its validation split."""
    for name in ("sft", "pairs"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()]
        chats = rows[:sft] if split == "train" else rows[:held_out]
        duels = rows[sft : sft + pairs] if split == "train" else rows[:held_out]
        with open(folder / "sft" / f"{split}.jsonl", "w") as out:
            for row in chats:
                chat = [{"role": "user", "content": QUESTION + row["text"]},
                        {"role": "assistant", "content": LABELS[row["label"]]}]  # fmt: skip
                out.write(json.dumps({"messages": chat}) + "\n")
        with open(folder / "pairs" / f"{split}.jsonl", "w") as out:
            for row in duels:
                pair = {
                    "prompt": [{"role": "user", "content": QUESTION + row["text"]}],
                    "chosen": [{"role": "assistant", "content": LABELS[row["label"]]}],
                    "rejected": [{"role": "assistant", "content": LABELS[1 - row["label"]]}],
                }
                out.write(json.dumps(pair) + "\n")


def zoo_json(*argv: str) -> dict:
    """Run `zoo ARGV --json` in this process; its last printed JSON object."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = zoo_main([*argv, "--json"])
    if status != 0:
        raise SystemExit(f"zoo {' '.join(argv)} failed with status {status}")
    lines = [line for line in printed.getvalue().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def chat_accuracy(run: Path, folder: Path) -> dict:
    """Every validation review asked as `zoo chat RUN` asks it (greedy, the run's template)."""
    model, tokenizer = load_with_tokenizer(run)
    model = eqx.nn.inference_mode(model)
    chat_format = ChatFormat(tokenizer, template=chat_template(tokenizer, folder=run))
    rows = [json.loads(line) for line in (folder / "sft" / "validation.jsonl").open()]
    questions = [row["messages"][:1] for row in rows]
    expected = [row["messages"][1]["content"] for row in rows]
    said: list[str] = []
    for start in range(0, len(questions), 128):
        answers = replies(model, chat_format, questions[start : start + 128], max_new_tokens=3)
        said += [answer.text.strip() for answer in answers]
    # the batched answers are those of zoo.chat, one conversation at a time
    alone = zoo.chat(model, chat_format, questions[0], max_new_tokens=3).strip()
    assert alone == said[0], (alone, said[0])
    right = sum(a == b for a, b in zip(said, expected, strict=True))
    return {
        "task_accuracy": round(right / len(expected), 4),
        "answers": len(expected),
        "answers_not_a_label": sum(answer not in LABELS for answer in said),
        "answered_positive": round(sum(answer == "positive" for answer in said) / len(said), 4),
    }


def preference_accuracy(run: Path, pairs: Path) -> float:
    """Share of held-out pairs with log π(chosen) > log π(rejected) (SimPO's reward needs no
    reference, and both answers are one word plus the end of turn)."""
    result = zoo_json("eval", str(run), "--data", f"json:{pairs}", "--objective", "simpo")
    return round(result["rewards/accuracies"], 4)


def row(name: str, run: Path, folder: Path, own: dict | None, trained: dict | None) -> dict:
    result = {
        "run": name,
        "held_out_preference_accuracy": preference_accuracy(run, folder / "pairs"),
    }
    if own is not None:
        keep = ("loss", "rewards/accuracies", "rewards/margins", "rewards/chosen",
                "rewards/rejected")  # fmt: skip
        result["own_eval"] = {key: round(own[key], 4) for key in keep if key in own}
    result.update(chat_accuracy(run, folder))
    if trained is not None:
        result["train"] = {key: trained.get(key) for key in
                           ("train_loss", "tokens_per_s", "wall_seconds")}  # fmt: skip
    print(json.dumps(result), flush=True)
    return result


def reference_mode(name: str, extra: list[str], sft: Path, folder: Path, steps: int) -> dict:
    """One DPO `zoo train` process: its tokens/s and peak resident memory."""
    out = folder / ("reference-" + "-".join(name.replace(",", "").split()))
    command = [str(Path(sys.executable).parent / "zoo"), "train", "gpt", "--init", str(sft),
               "--data", f"json:{folder / 'pairs'}", "--objective", "dpo", "--beta", "0.1",
               "--steps", str(steps), "--batch-size", "16", "--lr", "5e-4", "--schedule",
               "constant", "--warmup", "5", "--eval-limit", "2", "--eval-every", str(steps),
               "--log-every", "10", "--out", str(out), "--json", *extra]  # fmt: skip
    started = time.perf_counter()
    # GNU time reports the peak of the exec'd program alone (a forked child's own ru_maxrss
    # would count the pages of this process it was forked from)
    peak_file = out.with_suffix(".peak_kib")
    timed = ["/usr/bin/time", "-f", "%M", "-o", str(peak_file), *command]
    done = subprocess.run(timed, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode})")
    printed = done.stdout
    peak_kib = int(peak_file.read_text().split()[-1])
    summary = json.loads([line for line in printed.splitlines() if line.startswith("{")][-1])
    result = {
        "reference": name,
        "flags": " ".join(extra),
        "steps": steps,
        "final_train_loss": summary.get("train_loss"),
        "eval_loss": summary.get("eval_loss"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "process_seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-reviews", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--held-out", type=int, default=500, help="validation reviews")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--steps", type=int, default=60, help="preference steps per loss")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per step")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--reference-steps", type=int, default=20)
    parser.add_argument("--only", choices=LOSSES, action="append")
    parser.add_argument("--reference-only", type=Path, metavar="FOLDER")
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.sft_reviews, args.pairs, args.held_out = 300, 200, 100
        args.sft_steps, args.steps, args.reference_steps = 10, 5, 5
    started = time.perf_counter()
    if args.reference_only:
        reference_only(args)
        return
    folder = Path(tempfile.mkdtemp(prefix="zoo-dpo-learning-"))
    write_data(folder, args.sft_reviews, args.pairs, args.held_out)
    sft = folder / "sft-run"
    sft_summary = zoo_json("train", "gpt", *MODEL, "--data", f"json:{folder / 'sft'}",
                           "--batch-size", "10", "--steps", str(args.sft_steps), "--lr", "2e-3",
                           "--schedule", "cosine", "--warmup", str(args.sft_steps // 20),
                           "--eval-limit", "2", "--eval-every", str(args.sft_steps),
                           "--out", str(sft))  # fmt: skip
    record = {
        "benchmark": "dpo_learning",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "settings": {key: value for key, value in vars(args).items() if key != "only"},
        "model": MODEL,
        "betas": BETAS,
        "data": "rotten_tomatoes (../shared/data): SFT chats of the first train reviews, pairs "
        "of the next ones; held out: the first validation reviews as pairs and as chats",
        "versions": {"jax": jax.__version__, "equinox": eqx.__version__, "zoo": zoo.__version__},
    }
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    out_file = RESULTS / f"dpo_learning-{stamp}-cpu.json"
    rows = [row("SFT", sft, folder, None, sft_summary)]
    modes: list[dict] = []

    def save() -> None:  # after every row, so that a stopped run keeps what it measured
        record.update(rows=rows, reference_modes=modes, machine=machine(),
                      seconds=round(time.perf_counter() - started, 1))  # fmt: skip
        if not args.quick:
            RESULTS.mkdir(exist_ok=True)
            out_file.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")

    save()
    for loss in args.only or LOSSES:
        out = folder / loss
        trained = zoo_json("train", "gpt", "--init", str(sft), "--data",
                           f"json:{folder / 'pairs'}", "--objective", loss, "--beta",
                           str(BETAS[loss]), "--steps", str(args.steps), "--batch-size",
                           str(args.batch_size), "--lr", str(args.lr), "--schedule", "constant",
                           "--warmup", "5", "--eval-limit", "2", "--eval-every",
                           str(args.steps), "--out", str(out))  # fmt: skip
        own = zoo_json("eval", str(out), "--data", f"json:{folder / 'pairs'}")
        rows.append(row(f"+ {loss} (β {BETAS[loss]})", out, folder, own, trained))
        save()
    for name, extra in REFERENCE_MODES.items():
        if args.reference_steps:
            modes.append(reference_mode(name, extra, sft, folder, args.reference_steps))
            save()
    print(json.dumps({"seconds": record["seconds"], "folder": str(folder)}))
    if not args.quick:
        print(f"wrote {out_file}")


def reference_only(args: argparse.Namespace) -> None:
    folder = args.reference_only
    modes = [reference_mode(name, extra, folder / "sft-run", folder, args.reference_steps)
             for name, extra in REFERENCE_MODES.items()]  # fmt: skip
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    record = {
        "benchmark": "dpo_learning (reference modes)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "reference_modes": modes,
        "machine": machine(),
        "versions": {"jax": jax.__version__, "equinox": eqx.__version__, "zoo": zoo.__version__},
    }
    out_file = RESULTS / f"dpo_learning-{stamp}-cpu-reference.json"
    out_file.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out_file}")


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "load_now": os.getloadavg(),
        "device": str(jax.devices()[0]),
    }


if __name__ == "__main__":
    main()
