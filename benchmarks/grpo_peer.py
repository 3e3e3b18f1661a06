"""GRPO with LoRA on SmolLM2-135M-Instruct, zoo against TRL's `GRPOTrainer`, one script.

`python benchmarks/grpo_peer.py [--steps 20] [--prompts 4] [--generations 8] [--completion 32]
[--eval 100]` (the `bench` and `hf` extras; run on purpose, never in CI). Both sides train the
same fp32 checkpoint on the same prompts, sums of two- and three-digit numbers asked in words
("What is 123 + 45? Reply with the number only."), with one reward, the last number of the
completion equals the sum: LoRA rank 8 (alpha 16) on the attention projections, the same
steps, prompts per step, completions per prompt, completion length, temperature 1, learning
rate, loss (`dapo`, TRL's default), β = 0, fp32 (TRL's `bf16=False`). Each side runs in its
own process: zoo through `zoo train gpt --objective grpo` (called in-process so that its
rollouts are timed), TRL through a script.

Reported per side: seconds per step split into generation (sampling, rewards, advantages) and
update (the forward and backward pass and the optimizer), the first step apart (compiles), the
process's peak resident memory, and the accuracy of greedy answers to `--eval` held-out sums
read back through transformers + peft from each side's saved adapter (the same code for both).
Writes `benchmarks/results/grpo_peer-DATE-DEVICE.json` with the versions and the load average at
the start (the machine may be shared: compare quiet runs). `--random-preset NAME` trains random
weights of a zoo preset instead (speed only, no accuracy), as `finetune_peer.py` does.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from finetune_peer import TARGETS, checkpoint, random_folder, versions

RESULTS = Path(__file__).resolve().parent / "results"
QUESTION = "What is {a} + {b}? Reply with the number only."


def sums(count: int, seed: int) -> list[dict]:
    """Conversational prompt rows with their `answer` column (TRL's and zoo's format)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(10, 1000), rng.randrange(10, 100)
        content = QUESTION.format(a=a, b=b)
        rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(a + b)})
    return rows


def last_number(text: str) -> float | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(found[-1]) if found else None


def correct(completions, answer, **_) -> list[float]:
    """The reward of both sides (TRL's signature): 1 when the last number is the sum."""
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        out.append(1.0 if last_number(text) == float(expected) else 0.0)
    return out


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def split(step_ends: list[float], generation: list[float]) -> dict:
    """Seconds per step (the first apart: it compiles), and its generation and update parts.

    `step_ends`: when each step began, then (TRL) the last one's end; zoo's are the times its
    batches were drawn, so its last step is not counted."""
    steps = [end - begin for begin, end in itertools.pairwise(step_ends)]
    later, later_generation = steps[1:] or steps, generation[1:] or generation
    per_step = statistics.mean(later)
    per_generation = statistics.mean(later_generation)
    return {"first_step_seconds": round(steps[0], 2), "seconds_per_step": round(per_step, 3),
            "generation_seconds_per_step": round(per_generation, 3),
            "update_seconds_per_step": round(per_step - per_generation, 3)}  # fmt: skip


def zoo_worker(args: argparse.Namespace) -> dict:
    """zoo's side: `zoo train` in this process, its rollouts and steps timed."""
    import zoo.tasks.grpo_rollouts as rollouts
    from zoo.cli import main

    work = Path(args.run)
    data = work / "prompts"
    data.mkdir(parents=True, exist_ok=True)
    with (data / "train.jsonl").open("w") as out:
        for row in sums(args.train, seed=0):
            out.write(json.dumps(row) + "\n")
    (work / "grpo_peer_rewards.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(work))
    step_ends: list[float] = []
    generation: list[float] = []
    draw, rollout = rollouts.Rollouts.batch_for, rollouts.Rollouts.rollout

    def timed_batch_for(self, step, model, key):
        step_ends.append(time.perf_counter())  # a step starts when its batch is drawn
        return draw(self, step, model, key)

    def timed_rollout(self, step, model, key):
        started = time.perf_counter()
        batch = rollout(self, step, model, key)
        generation.append(time.perf_counter() - started)
        return batch

    rollouts.Rollouts.batch_for, rollouts.Rollouts.rollout = timed_batch_for, timed_rollout
    out_dir = work / "zoo-run"
    code = main(["train", "gpt", "--init", args.hf_dir, "--data", f"json:{data}",
                 "--objective", "grpo", "--reward", "grpo_peer_rewards:correct",
                 "--lora", f"rank={args.rank},alpha={2 * args.rank},targets=attention",
                 "--num-generations", str(args.generations),
                 "--batch-size", str(args.prompts * args.generations),
                 "--max-completion-len", str(args.completion), "--temperature", "1.0",
                 "--steps", str(args.steps), "--lr", str(args.lr), "--schedule", "constant",
                 "--warmup", "0", "--weight-decay", "0", "--precision", "fp32",
                 "--log-every", "1", "--no-progress", "--json", "--seed", str(args.seed),
                 "--out", str(out_dir)])  # fmt: skip
    if code != 0:
        raise RuntimeError(f"zoo train exited with {code}")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").open()]
    rewards = [row["metrics"]["reward"] for row in rows if row["split"] == "train"]
    return {**split(step_ends, generation), "peak_rss_mb": peak_rss_mb(), "rewards": rewards,
            "adapter": str(out_dir / "adapter")}  # fmt: skip


REWARD_MODULE = """import re


def correct(completions, answer, **_):
    out = []
    for completion, expected in zip(completions, answer):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        found = re.findall(r"-?\\d+(?:\\.\\d+)?", text.replace(",", ""))
        out.append(1.0 if found and float(found[-1]) == float(expected) else 0.0)
    return out
"""


def trl_worker(args: argparse.Namespace) -> dict:
    """TRL's side: `GRPOTrainer` with peft, its generation and steps timed."""
    import datasets
    import torch
    import transformers
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    config = GRPOConfig(output_dir=args.run, max_steps=args.steps, learning_rate=args.lr,
                        per_device_train_batch_size=args.prompts * args.generations,
                        num_generations=args.generations, max_completion_length=args.completion,
                        temperature=1.0, beta=0.0, loss_type="dapo", lr_scheduler_type="constant",
                        warmup_steps=0, weight_decay=0.0, save_strategy="no", report_to=[],
                        logging_steps=1, use_cpu=not torch.cuda.is_available(), bf16=False,
                        seed=args.seed)  # fmt: skip
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                      target_modules=TARGETS, task_type="CAUSAL_LM")  # fmt: skip
    step_ends: list[float] = []
    generation: list[float] = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_begin(self, *unused, **also_unused):
            if not step_ends:
                step_ends.append(time.perf_counter())

        def on_step_end(self, *unused, **also_unused):
            step_ends.append(time.perf_counter())

    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=config,
                          train_dataset=datasets.Dataset.from_list(sums(args.train, seed=0)),
                          processing_class=tokenizer, peft_config=lora,
                          callbacks=[StepTimes()])  # fmt: skip
    generate = trainer._generate_and_score_completions

    def timed(inputs):
        started = time.perf_counter()
        output = generate(inputs)
        generation.append(time.perf_counter() - started)
        return output

    trainer._generate_and_score_completions = timed
    trainer.train()
    trainer.save_model(args.run)
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    return {**split(step_ends, generation), "peak_rss_mb": peak_rss_mb(), "rewards": rewards,
            "adapter": args.run}  # fmt: skip


def accuracy(hf_dir: str, adapter: str | None, count: int) -> float:
    """The share of `count` held-out sums answered right, greedily (transformers + peft)."""
    import torch
    import transformers
    from peft import PeftModel

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    tokenizer.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    rows = sums(count, seed=1)
    right = 0
    for start in range(0, len(rows), 25):
        chunk = rows[start : start + 25]
        prompts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False,
                                                 add_generation_prompt=True) for row in chunk]  # fmt: skip
        batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=16, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :],
                                       skip_special_tokens=True)  # fmt: skip
        right += sum(correct(texts, [row["answer"] for row in chunk]))
    return round(right / len(rows), 4)


def run_side(side: str, args: argparse.Namespace, hf_dir: Path, work: Path) -> dict:
    """One side in a process of its own (its peak memory its own)."""
    out = work / side
    out.mkdir(parents=True, exist_ok=True)
    timings = work / f"{side}.json"
    command = [sys.executable, __file__, "--worker", side, "--hf-dir", str(hf_dir), "--run",
               str(out), "--timings", str(timings)] + [f"--{name}={getattr(args, name)}" for name
               in ("steps", "prompts", "generations", "completion", "lr", "rank", "train", "seed")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{done.stderr[-3000:]}")
    result = json.loads(timings.read_text())
    if args.eval:
        result["accuracy"] = accuracy(str(hf_dir), result["adapter"], args.eval)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--completion", type=int, default=32, help="most completion tokens")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--train", type=int, default=1000, help="training prompts")
    parser.add_argument("--eval", type=int, default=100, help="held-out sums answered (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("zoo", "trl"), help="run one side")
    parser.add_argument("--random-preset", metavar="PRESET",
                        help="random weights of this zoo preset (speed only)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. the machine)")
    parser.add_argument("--worker", choices=("zoo", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--timings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker = zoo_worker if args.worker == "zoo" else trl_worker
        Path(args.timings).write_text(json.dumps(worker(args)))
        return
    if args.random_preset:
        args.eval = 0
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    result: dict = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device, "cpus": os.cpu_count(), "machine": platform.machine(),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        **{name: getattr(args, name) for name in ("steps", "prompts", "generations",
                                                   "completion", "lr", "rank", "eval", "seed")},
        "weights": f"random {args.random_preset}" if args.random_preset else "SmolLM2-135M-Instruct",
        "note": args.note, "versions": versions()}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        if args.random_preset:
            hf_dir = random_folder(args.random_preset, Path(scratch) / "random")
        else:
            hf_dir = checkpoint()
        if args.eval:
            result["base_accuracy"] = accuracy(str(hf_dir), None, args.eval)
        for side in ("trl", "zoo"):
            if args.only in (None, side):
                try:
                    result[side] = run_side(side, args, hf_dir, Path(scratch))
                except RuntimeError as error:  # the other side still runs and is reported
                    result[side] = {"error": str(error)[-2000:]}
                print(side, json.dumps(result[side]), file=sys.stderr)
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    path = args.results / f"grpo_peer-{stamp}-{device}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"wrote {path}")


def print_table(result: dict) -> None:
    sides = [side for side in ("zoo", "trl") if "seconds_per_step" in result.get(side, {})]
    rows = [("seconds per step", "seconds_per_step"),
            ("generation s per step", "generation_seconds_per_step"),
            ("update s per step", "update_seconds_per_step"),
            ("first step (compiles), s", "first_step_seconds"),
            ("peak resident memory, MB", "peak_rss_mb"), ("held-out accuracy", "accuracy")]  # fmt: skip
    print("| | " + " | ".join(sides) + " |\n| --- |" + " --- |" * len(sides))
    for label, name in rows:
        print(f"| {label} | " + " | ".join(str(result[side].get(name)) for side in sides) + " |")
    if "base_accuracy" in result:
        print(f"accuracy before training: {result['base_accuracy']}")


if __name__ == "__main__":
    main()
