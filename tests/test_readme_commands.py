"""The shell commands in README.md and docs/ run as written from a fresh clone.

Every fenced command (tests/doc_commands.py collects them) is either in RUN, cheap enough to run
here for real (in an empty folder with `../shared` beside it, as from the checkout's root), or in
NOT_RUN with the reason it is not run; a new command fails until it is classified, and a table
entry no page holds any more fails too. Run or not, each one is checked without running it
(`doc_commands.Checks`): `zoo` invocations parse with zoo's own parser, presets and data exist,
every path read exists beside the checkout or is written by a documented command. `.ci/run`
runs the README's two commands first, verbatim.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_commands import (
    FENCE,
    ROOT,
    SHARED,
    Checks,
    DocCommand,
    Docs,
    block_commands,
    doc_commands,
    extras,
)

# --- how each command is exercised -------------------------------------------------------------

# each cheap command, and the folders it must fill
RUN = {
    # docs/tutorials/pretrain-then-finetune.md: the rotten_tomatoes texts as plain text files
    "python -c \" import json, pathlib out = pathlib.Path('runs/rt_text'); "
    "out.mkdir(parents=True, exist_ok=True) for split in ('train', 'validation'): rows = "
    "[json.loads(l)['text'] for l in open(f'../shared/data/rotten_tomatoes/{split}.jsonl')] "
    "(out / f'{split}.txt').write_text('\\n'.join(rows) + '\\n') \"": ("runs/rt_text",),
    # docs/tutorials/instruction-tuning.md: the rotten_tomatoes reviews as chats
    "python -c \" import json, pathlib out = pathlib.Path('runs/rt_chats'); "
    "out.mkdir(parents=True, exist_ok=True) question = 'Classify this review as positive or "
    "negative: ' for split in ('train', 'validation'): with open(out / f'{split}.jsonl', 'w') "
    "as f: for line in open(f'../shared/data/rotten_tomatoes/{split}.jsonl'): row = "
    "json.loads(line) answer = ('negative', 'positive')[row['label']] chat = [{'role': 'user', "
    "'content': question + row['text']}, {'role': 'assistant', 'content': answer}] "
    "f.write(json.dumps({'messages': chat}) + '\\n') \"": ("runs/rt_chats",),
    # docs/tutorials/instruction-tuning.md: the same reviews, asked another way, to mix in
    "python -c \" import json, pathlib out = pathlib.Path('runs/rt_chats_b'); "
    "out.mkdir(parents=True, exist_ok=True) for split in ('train', 'validation'): with "
    "open(out / f'{split}.jsonl', 'w') as f: for line in "
    "open(f'../shared/data/rotten_tomatoes/{split}.jsonl'): row = json.loads(line) chat = "
    "[{'role': 'user', 'content': 'Is this review positive or negative? ' + row['text']}, "
    "{'role': 'assistant', 'content': ('negative', 'positive')[row['label']]}] "
    "f.write(json.dumps({'messages': chat}) + '\\n') \"": ("runs/rt_chats_b",),
    # docs/tutorials/dpo.md: SFT chats of some reviews, preference pairs of the others
    "python -c \" import json, pathlib question = 'Classify this review as positive or negative: ' "
    "labels = ('negative', 'positive') for name in ('runs/rt_sft_chats', 'runs/rt_pairs'): "
    "pathlib.Path(name).mkdir(parents=True, exist_ok=True) for split in ('train', 'validation'): "
    "rows = [json.loads(line) for line in "
    "open(f'../shared/data/rotten_tomatoes/{split}.jsonl')] sft = rows[:4000] if split == "
    "'train' else rows pairs = rows[4000:] if split == 'train' else rows with "
    "open(f'runs/rt_sft_chats/{split}.jsonl', 'w') as f: for row in sft: chat = [{'role': "
    "'user', 'content': question + row['text']}, {'role': 'assistant', 'content': "
    "labels[row['label']]}] f.write(json.dumps({'messages': chat}) + '\\n') with "
    "open(f'runs/rt_pairs/{split}.jsonl', 'w') as f: for row in pairs: pair = {'prompt': "
    "[{'role': 'user', 'content': question + row['text']}], 'chosen': [{'role': 'assistant', "
    "'content': labels[row['label']]}], 'rejected': [{'role': 'assistant', 'content': "
    "labels[1 - row['label']]}]} f.write(json.dumps(pair) + '\\n') \"": (
        "runs/rt_sft_chats",
        "runs/rt_pairs",
    ),
    # docs/grpo.md: `a+b=` prompts with their answers
    "python -c \" import json, pathlib, random out = pathlib.Path('runs/sums_prompts'); "
    "out.mkdir(parents=True, exist_ok=True) rng = random.Random(0) with open(out / "
    "'train.jsonl', 'w') as f: for _ in range(2000): a, b = rng.randrange(10), "
    "rng.randrange(10) f.write(json.dumps({'prompt': f'{a}+{b}=', 'answer': str(a + b)}) + "
    "'\\n') \"": ("runs/sums_prompts",),
    # docs/benchmarks.md: the wheels a GPU machine lacks
    "mkdir -p .whl && cp ../shared/gpu-wheels/*.whl .whl/": (".whl",),
    # docs/moe.md's export recipe: a tiny mixture saved (tests/interop/test_moe_recipe.py runs
    # the whole recipe)
    "python -c \"import jax, zoo; zoo.save(zoo.create('mixtral-tiny', key=jax.random.key(0)), "
    "'runs/mixtral-tiny')\"": ("runs/mixtral-tiny",),
    # docs/benchmarks.md: the data of the GPU suite's finetune row
    "mkdir -p .gpu-data && cp -r ../shared/data/rotten_tomatoes .gpu-data/": (".gpu-data",),
}

CI = ".ci/run runs it (test_ci_runs_the_readme_commands_first)"
TRAINS = "trains a model for minutes to hours on a CPU"
RUN_DIR = "reads a run directory that a documented training command writes"
BENCH = "times models for minutes"
GPU = "needs a GPU machine"
READERS = "reads the reader's own data (READERS_DATA), which a clone does not hold"
HOSTS = "needs several hosts (a coordinator address, SLURM)"
PROCESSES = "two processes of 4 forced CPU devices each, a minute"
GGUF = "needs a real .gguf file, which a clone does not hold"
SERVES = "downloads a model from the hub and serves it until stopped"
TRANSCRIPT = "a transcript's record of the machine's load while it measured"
RECIPE = "reads the folder of the line before it; tests/interop/test_moe_recipe.py runs both"

NOT_RUN = {
    # docs/grpo.md
    "zoo train gpt --preset llama-tiny --data json:runs/sums_prompts --objective grpo --reward "
    "numeric:answer --reward 'format:^\\d+$' --num-generations 8 --batch-size 64 "
    "--max-completion-len 4 --lr 3e-3 --warmup 10 --steps 150 --log-every 10 --sample-every 50 "
    "--out runs/grpo_sums": TRAINS,
    "zoo export runs/mixtral-tiny --hf runs/mixtral-tiny-hf --no-tokenizer": RECIPE,
    # docs/preference.md and its measured row in docs/results.md
    "zoo train gpt --init runs/sft --data json:pairs/ --objective dpo --beta 0.1 --steps 200 "
    "--batch-size 8 --lr 5e-6 --out runs/dpo": TRAINS,
    "zoo eval runs/dpo --data json:pairs/ --reference runs/sft": RUN_DIR,
    "zoo train gpt --init hf:HuggingFaceTB/SmolLM2-135M-Instruct --data json:pairs/ --objective "
    "reward --lr 1e-5 --batch-size 8 --steps 500 --out runs/rm": TRAINS,
    "zoo train classifier --preset classifier-tiny --tokenizer char --data json:pairs/ "
    "--objective reward --steps 200 --out runs/rm-encoder": TRAINS,
    "zoo train gpt --preset gpt-tiny --data json:rt_sft --tokenizer word --steps 300 "
    "--batch-size 16 --lr 2e-3 --max-len 64 --out runs/sft": TRAINS,
    "zoo eval runs/sft --data json:rt_pref --objective simpo": RUN_DIR,
    "zoo train gpt --init runs/sft --data json:rt_pref --objective dpo --beta 0.1 --steps 250 "
    "--batch-size 16 --lr 5e-4 --schedule constant --warmup 10 --out runs/dpo": TRAINS,
    "zoo eval runs/dpo --data json:rt_pref --objective simpo": RUN_DIR,
    "zoo eval runs/dpo --data json:rt_pref": RUN_DIR,
    # docs/tutorials/dpo.md: SFT, DPO from it, the held-out pairs, a chat
    "zoo train gpt --preset llama-tiny --set d_model=128 --set num_layers=4 --set d_ff=384 "
    "--data json:runs/rt_sft_chats --tokenizer word --min-freq 2 --lowercase --max-len 127 "
    "--batch-size 10 --steps 250 --lr 1e-3 --schedule cosine --warmup 12 --weight-decay 0.01 "
    "--out runs/rt_sft": TRAINS,
    "zoo train gpt --init runs/rt_sft --data json:runs/rt_pairs --objective dpo --beta 0.1 "
    "--reference runs/rt_sft --precompute-reference --batch-size 16 --steps 80 --lr 5e-5 "
    "--schedule constant --warmup 10 --eval-every 80 --out runs/rt_dpo": TRAINS,
    "zoo eval runs/rt_dpo --data json:runs/rt_pairs --json": RUN_DIR,
    "zoo eval runs/rt_sft --data json:runs/rt_pairs --objective simpo --json": RUN_DIR,
    "zoo eval runs/rt_dpo --data json:runs/rt_pairs --objective simpo --json": RUN_DIR,
    'zoo chat runs/rt_dpo --message "Classify this review as positive or negative: a gorgeous, '
    'witty film" --json': RUN_DIR,
    # docs/pretrained.md, GGUF files: a real .gguf (benchmarks/gguf_smollm2.py downloads one)
    "pip install -e '.[gguf]'": "installs into the environment; .ci/run installs it",
    "zoo chat SmolLM2-135M-Instruct.Q4_1.gguf": GGUF,
    'zoo generate model.gguf --prompt "Once upon a time"': GGUF,
    "zoo train gpt --init model.gguf --data json:my_chats --lora rank=8 --out runs/gguf_lora": GGUF,
    # docs/results.md, ModernBERT against a BERT of the same size
    "zoo train classifier --preset classifier-small --data json:../shared/data/rotten_tomatoes "
    "--steps 400 --batch-size 32 --eval-every 400 --out runs/bert": TRAINS,
    "zoo train classifier --preset modernbert-tiny --set d_model=128 --set num_layers=2 "
    "--set num_heads=4 --set d_ff=172 --set max_positions=64 --max-len 64 "
    "--min-freq 2 --data json:../shared/data/rotten_tomatoes --steps 400 --batch-size 32 "
    "--eval-every 400 --out runs/modernbert": TRAINS,
    # docs/configs.md: --set by alias and by short path (checked as zoo train reads it)
    "zoo train gpt --preset llama-tiny --set num_layers=4 --set attention.window=64 "
    "--data synthetic:addition --steps 20 --out runs/window": TRAINS,
    # docs/moe.md: LoRA and int8 on the experts (tests/nn/test_moe_lora.py runs these options)
    "zoo train gpt --preset mixtral-tiny --data synthetic:addition --steps 200 --out runs/moe-lora "
    "--lora rank=8,alpha=16,targets=experts,attention --quantize int8": TRAINS,
    # docs/benchmarks.md and docs/moe.md: both MoE paths against transformers
    "zoo bench --preset mixtral-bench --moe-path ragged,dense --peer torch": BENCH,
    "zoo bench --preset mixtral-bench --moe-path ragged,dense --peer torch --batch 8 --seq 128 "
    "--decode-tokens 0": BENCH,
    # docs/results.md, the mixture of experts against a dense model
    "zoo train gpt --preset mixtral-tiny --set d_model=128 --set num_layers=4 --set d_ff=256 "
    "--set feed_forward.num_experts=8 --set feed_forward.top_k=2 --set max_positions=256 --out runs/moe "
    "--data text:../shared/data/tiny_shakespeare --tokenizer char --steps 300 "
    "--batch-size 16 --max-len 128 --eval-every 100 --lr 0.003 --warmup 30 --log-every 25": TRAINS,
    "zoo train gpt --preset llama-tiny --set d_model=128 --set num_layers=4 --set d_ff=512 "
    "--set max_positions=256 --out runs/dense --data text:../shared/data/tiny_shakespeare "
    "--tokenizer char --steps 300 --batch-size 16 --max-len 128 --eval-every 100 --lr 0.003 "
    "--warmup 30 --log-every 25": TRAINS,
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/zoo demo": CI,
    ".venv/bin/python -m pytest -q -n 2": CI,
    "pip install -e '.[docs]'": ".ci/run installs the docs extra (into its own venv)",
    "mkdocs build --strict": ".ci/run builds the site strictly (into a temporary folder)",
    "mkdocs serve": "serves the site until stopped; .ci/run builds the same site",
    "pip install -e '.[distributed]'": "installs into the environment; .ci/run installs it",
    "uptime": TRANSCRIPT,
    "zoo demo": "two minutes of training; the README's first command runs it in .ci/run",
    "zoo demo --flavor translator": "half a minute of training; .ci/run runs the whole demo",
    "zoo train gpt --preset gpt-tiny --data synthetic:addition --steps 400 --out runs/a --json": TRAINS,
    "zoo train gpt --preset gpt-tiny --data synthetic:addition --steps 800 --out runs/a --resume": TRAINS,
    "zoo train classifier --preset classifier-small --data json:../shared/data/rotten_tomatoes "
    "--out runs/rt": TRAINS,
    "zoo train translator --preset translator-small --data json:../shared/data/multi30k "
    "--source de --target en --out runs/mt": TRAINS,
    "zoo train translator --preset translator-small --data json:../shared/data/multi30k "
    "--source de --target en --out runs/mt --checkpoint-every 250 --keep 20 --log-every 50": TRAINS,
    "zoo train gpt --preset gpt-small --data text:../shared/data/tiny_shakespeare "
    "--tokenizer char --out runs/shake": TRAINS,
    "zoo train gpt --preset gpt-small --data text:../shared/data/tiny_shakespeare "
    "--tokenizer char --out runs/base": TRAINS,
    "TIKTOKEN_CACHE_DIR=../shared/tiktoken zoo train gpt --preset gpt-small "
    "--data text:../shared/data/tiny_shakespeare --tokenizer tiktoken:gpt2 --out runs/shake-bpe": TRAINS,
    "zoo train translator --preset translator-tiny --data synthetic:rot13 --steps 500 "
    "--batch-size 64 --lr 3e-3 --warmup 50 --out runs/rot13": TRAINS,
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 zoo train gpt --preset gpt-tiny "
    "--data synthetic:addition --steps 200 --batch-size 32 --mesh data=2,fsdp=2,tensor=2 "
    "--out runs/mesh": TRAINS,
    "zoo train classifier --preset classifier-small --objective mlm --data text:runs/rt_text "
    "--steps 500 --eval-every 125 --out runs/rt_mlm": TRAINS,
    "zoo train classifier --init runs/rt_mlm --data json:../shared/data/rotten_tomatoes "
    "--steps 800 --lr 1e-3 --schedule cosine --warmup 100 --weight-decay 0.1 --eval-every 200 "
    "--out runs/rt_tuned": TRAINS,
    "zoo train classifier --preset classifier-small --data json:../shared/data/rotten_tomatoes "
    "--out runs/rt_scratch": TRAINS,
    "zoo train classifier --preset classifier-small --data json:../shared/data/rotten_tomatoes "
    "--steps 2800 --eval-every 200 --out runs/rt_scratch_long": TRAINS,
    "for i in 0 1; do XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu "
    "zoo train gpt --preset gpt-tiny --data synthetic:addition --steps 20 --batch-size 8 "
    "--mesh data=2,fsdp=4 --out runs/two --coordinator localhost:12355 --num-processes 2 "
    "--process-id $i & done; wait": PROCESSES,
    "for i in 0 1; do XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu "
    "zoo eval runs/two --data text:sums --mesh data=2,fsdp=4 --coordinator localhost:12356 "
    "--num-processes 2 --process-id $i & done; wait": READERS,
    "zoo eval runs/rt --data json:../shared/data/rotten_tomatoes --split validation --json": RUN_DIR,
    "zoo eval runs/rt_tuned --data json:../shared/data/rotten_tomatoes --split validation "
    "--json": RUN_DIR,
    "zoo eval runs/mt --data json:../shared/data/multi30k --split test --json": RUN_DIR,
    "zoo eval runs/shake --data text:../shared/data/tiny_shakespeare --split validation "
    "--json": RUN_DIR,
    'zoo generate runs/shake --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8': RUN_DIR,
    'zoo generate runs/shake --prompt "ROMEO:" --max-new-tokens 120 --temperature 0.8': RUN_DIR,
    'zoo generate runs/shake --prompt "ROMEO:" --max-new-tokens 200 --mesh fsdp=-1': RUN_DIR,
    'zoo generate runs/lora --prompt "ROMEO:"': RUN_DIR,
    'zoo generate runs/base --adapter runs/lora/adapter --prompt "ROMEO:"': RUN_DIR,
    'zoo translate runs/mt "Ein Mann fährt Fahrrad." --beam-size 4': RUN_DIR,
    'zoo translate runs/mt "Ein Mann fährt Fahrrad." --beam-size 4 --mesh data=2,tensor=-1': RUN_DIR,
    'zoo classify runs/rt "a gorgeous, witty film"': RUN_DIR,
    'zoo classify runs/rt "a gorgeous, witty film" --mesh data=-1': RUN_DIR,
    'zoo plot-attention runs/mt "Ein Mann fährt Fahrrad." --out attn.png': RUN_DIR,
    "zoo train gpt --preset llama-tiny --set d_model=128 --set num_layers=4 --set d_ff=384 "
    "--data json:runs/rt_chats --tokenizer word --min-freq 2 --lowercase --max-len 127 "
    "--batch-size 10 --steps 783 --lr 1e-3 --schedule cosine --warmup 39 --weight-decay 0.01 "
    "--out runs/rt_chat": TRAINS,
    'zoo chat runs/rt_chat --message "Classify this review as positive or negative: a '
    'gorgeous, witty film"': RUN_DIR,
    "zoo train gpt --preset llama-tiny --data json:runs/rt_chats --tokenizer word --min-freq 2 "
    "--lowercase --max-len 127 --show-data 2": "reads runs/rt_chats, which the tutorial writes",
    "zoo train gpt --config runs/rt_chat/train_config.yaml --out runs/rt_chat_again": TRAINS,
    "zoo train gpt --config runs/rt_chat/train_config.yaml --data json:runs/rt_chats --data "
    "json:runs/rt_chats_b:0.3 --sample-every 200 --out runs/rt_mixed": TRAINS,
    'zoo chat runs/rt_chat --message "Classify this review as positive or negative: a '
    'gorgeous, witty film" --json': RUN_DIR,
    'zoo chat runs/rt_chat --system "Answer with one word." --temperature 0.7 --top-p 0.9': RUN_DIR,
    "zoo chat runs/rt_chat --json --max-new-tokens 3": RUN_DIR,
    "zoo train gpt --init hf:HuggingFaceTB/SmolLM2-135M-Instruct --data json:my_chats --lora "
    "rank=8,targets=all-linear --quantize int8 --max-len 512 --batch-size 8 --steps 300 --merge "
    "--out runs/smol-chat": READERS,
    'zoo chat runs/smol-chat --system "You are a concise assistant."': RUN_DIR,
    # docs/preference.md: SFT with LoRA, then DPO with LoRA from it
    "zoo train gpt --init hf:HuggingFaceTB/SmolLM2-135M-Instruct --data json:my_chats --lora "
    "rank=8,alpha=16,targets=all-linear --steps 300 --out runs/sft-lora": READERS,
    "zoo train gpt --init runs/sft-lora --data json:pairs/ --objective dpo --beta 0.1 --lora "
    "rank=8,alpha=16,targets=all-linear --precompute-reference --steps 200 --lr 5e-5 --out "
    "runs/dpo-lora": READERS,
    # docs/coming-from-trl.md: SFT with LoRA, then DPO with LoRA from it
    "zoo train gpt --init hf:HuggingFaceTB/SmolLM2-135M-Instruct --data json:my_chats --lora "
    "rank=16,alpha=32 --out runs/sft": READERS,
    "zoo train gpt --init runs/sft --data json:pairs/ --objective dpo --lora rank=16,alpha=32 "
    "--out runs/dpo": READERS,
    # docs/serve.md
    "pip install -e '.[serve]'": "installs into the environment; .ci/run installs it",
    "zoo serve runs/smol-chat --port 8000": RUN_DIR,
    "zoo serve hf:HuggingFaceTB/SmolLM2-135M-Instruct --port 8000 --max-batch 16": SERVES,
    "zoo serve runs/smol-chat --host 0.0.0.0 --port 8000 --api-key my-key": RUN_DIR,
    "zoo export runs/smol-chat --hf runs/smol-chat-hf": RUN_DIR,
    "zoo export runs/smol-chat --hf runs/smol-chat-hf --json": RUN_DIR,
    "zoo train classifier --init runs/rt --data json:my_reviews --freeze embeddings,layers:0-0 "
    "--out runs/ft": READERS,
    "zoo train gpt --init runs/base --data text:other.txt --tokenizer char --lora "
    "rank=8,alpha=16,targets=attention --steps 500 --out runs/lora": READERS,
    "zoo train gpt --init runs/base --data text:other.txt --tokenizer char --lora "
    "rank=8,alpha=16,targets=attention --steps 800 --out runs/lora --resume --merge": READERS,
    "zoo train translator --init /data/flan-t5-small --data json:pairs/ --source de --target en "
    "--out runs/flan-de-en": READERS,
    "zoo train gpt --preset gpt2-medium --data text:corpus.txt --tokenizer tiktoken:gpt2 "
    "--batch-size 32 --mesh fsdp=8 --out runs/medium": GPU,
    "zoo train gpt --preset gpt2 --data text:corpus.txt --tokenizer tiktoken:gpt2 --batch-size 64 "
    "--precision bf16 --mesh data=2,fsdp=4 --out runs/gpt2": GPU,
    "zoo train gpt --preset gpt2 --data text:corpus.txt --tokenizer tiktoken:gpt2 --batch-size 64 "
    "--mesh data=2,fsdp=8 --out /shared/runs/gpt2 --coordinator 10.0.0.1:1234 --num-processes 2 "
    "--process-id 0": HOSTS,
    "srun zoo train gpt --preset gpt2-medium --data text:corpus.txt --tokenizer tiktoken:gpt2 "
    "--batch-size 128 --mesh data=4,fsdp=8 --out /shared/runs/medium --distributed auto": HOSTS,
    "zoo bench": BENCH,
    "zoo bench --flavor gpt --preset gpt2 --batch 16 --seq 1024 --precision bf16 --json": BENCH,
    "zoo bench --peer torch": BENCH,
    "zoo bench --preset gpt2 --batch 4 --seq 256 --peer floor --peer torch": BENCH,
    "zoo bench --peer torch --peer-compile": BENCH,
    "taskset -c 0 zoo bench --preset llama-tiny --batch 16 --seq 64 --profile prof/": BENCH,
    "taskset -c 0 zoo bench --peer torch --peer-compile --batch 16 --seq 64 --preset gpt-tiny "
    "--preset classifier-tiny --preset translator-tiny --preset gpt-small --preset "
    "classifier-small --preset translator-small": BENCH,
    "taskset -c 0 zoo bench --peer torch --peer-compile --batch 16 --seq 64 --preset llama-tiny "
    "--preset gpt-tiny": BENCH,
    "taskset -c 0 zoo bench --preset llama-tiny --batch 16 --seq 64 --steps 20 --no-save "
    "--profile DIR": BENCH,
    "taskset -c 0 zoo bench --preset llama-tiny --batch 16 --seq 64 --peer torch "
    "--peer-compile": BENCH,
    "benchmarks/gpu.sh RESULTS_DIR": GPU,
    "benchmarks/gpu.sh --dry-run RESULTS_DIR": "the whole GPU job rehearsed: several minutes",
    "benchmarks/gpu.sh --archive OUT.tar.gz RESULTS_DIR": GPU,
}

# Paths that stand for the reader's own data: a clone does not hold them.
READERS_DATA = {"corpus.txt", "other.txt", "my_reviews", "pairs/", "/data/flan-t5-small", "sums",
                "my_chats", "rt_sft", "rt_pref", "model.gguf",
                "SmolLM2-135M-Instruct.Q4_1.gguf"}  # fmt: skip
WRITTEN_BY_RUN = {folder for folders in RUN.values() for folder in folders}

COMMANDS = doc_commands()
DOCS = Docs(COMMANDS, READERS_DATA, WRITTEN_BY_RUN)


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_doc_command_is_classified_and_valid(command):
    if command.key not in RUN and command.key not in NOT_RUN:
        pytest.fail(
            f"{command}: `{command.key}` is in neither RUN nor NOT_RUN of "
            "tests/test_readme_commands.py: run it there if it is cheap, else give the reason"
        )
    checks = Checks(command, DOCS)
    assert checks.problems == []
    if checks.needs_shared:
        pytest.skip(f"../shared is absent: unchecked {', '.join(checks.needs_shared)}")


@pytest.mark.parametrize("key", sorted(RUN), ids=lambda key: key[:40])
def test_cheap_doc_command_runs(key, tmp_path):
    """Run in an empty folder with `../shared` beside it, as from the checkout's root."""
    if "../shared" in key:
        if not SHARED.is_dir():
            pytest.skip("../shared is absent")
        (tmp_path / "shared").symlink_to(SHARED)
    (tmp_path / "main").mkdir()
    (command,) = {c.text for c in COMMANDS if c.key == key}
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command],
        cwd=tmp_path / "main",
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for folder in RUN[key]:
        assert any((tmp_path / "main" / folder).iterdir()), f"{folder} is empty"


def test_every_table_entry_is_a_documented_command():
    keys = {command.key for command in COMMANDS}
    assert set(RUN) - keys == set()
    assert set(NOT_RUN) - keys == set()
    assert set(RUN) & set(NOT_RUN) == set()


def readme_two_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
    commands = [c for lang, body in FENCE.findall(section) for _, c in block_commands(lang, body)]
    assert len(commands) == 2, commands
    return commands


def test_ci_runs_the_readme_commands_first():
    """Verbatim, in a venv it made afresh, before any other pip, venv or Python step."""
    setup, tests = readme_two_commands()
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [line for line in lines if line and not line.startswith("#")]
    assert setup in steps and tests in steps
    assert steps.index(setup) < steps.index(tests)
    assert "rm -rf .venv" in steps[: steps.index(setup)]
    environment = re.compile(r"\b(pip|venv|python3?|pytest|export|source|env)\b|^[A-Z_]+=")
    before = [s for s in steps[: steps.index(tests)] if s not in (setup, "rm -rf .venv")]
    assert [step for step in before if environment.search(step)] == []


def test_ci_installs_extras_that_exist():
    named = re.findall(r"\.\[([\w,-]+)\]", (ROOT / ".ci" / "run").read_text())
    assert named
    assert {e for group in named for e in group.split(",")} - extras() == set()


BROKEN = [  # a command, and what the checks must say of it
    ("zoo train gpt --preset gpt-tiny --data synthetic:addition --stepz 4 --out x", "--stepz"),
    ("zoo train gpt --preset gpt-huge --data synthetic:addition --out x", "not a preset"),
    ("zoo train gpt --preset gpt-tiny --data synthetic:sums --out x", "no such synthetic"),
    ("zoo train gpt --preset gpt-tiny --data text:no/such/file --out x", "no such file"),
    ("zoo train gpt --preset gpt-tiny --data synthetic:addition --out x --resume", "no command"),
    (
        "zoo train gpt --preset gpt-tiny --data synthetic:addition --mesh data=2,fsdp --out x",
        "AXIS",
    ),
    ("zoo classify runs/never-trained 'a film'", "no such file"),
    ("pip install 'jax-transformer-zoo[hf]'", "install the checkout"),
    ("pip install -e '.[gpu]'", "no extra 'gpu'"),
    ("benchmarks/gpu.sh --fast RESULTS_DIR", "takes no such option"),
    ("make docs", "no check for this program"),
]


@pytest.mark.parametrize(("text", "said"), BROKEN)
def test_checks_find_a_broken_command(text, said):
    problems = Checks(DocCommand("docs/x.md", 1, text), DOCS).problems
    assert len(problems) == 1 and said in problems[0], problems
