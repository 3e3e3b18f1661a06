"""A GGUF file as a checkpoint: the HuggingFace config and state dict it holds, and its tokenizer.

`zoo.from_pretrained("model.gguf")` builds the model from them with the same engine as a
checkpoint folder (`zoo.interop.loading.load_state_dict`).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from zoo.interop.gguf.model import (
    GGUFConfig,
    hf_config,
    hf_name,
    hf_state_dict,
    rope_factor_names,
)
from zoo.interop.gguf.reader import read_gguf, read_tensors
from zoo.interop.gguf.tokenizer import gguf_tokenizer
from zoo.interop.tokenizers.fast_tokenizer import FastTokenizer

# the dtypes a dequantized tensor may be kept in on the way to the model
HOST_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a GGUF file: it ends in `.gguf` (the spelling every GGUF tool uses)
    and is no folder (a missing file is then refused by name, not looked up on the hub)."""
    return str(path).lower().endswith(".gguf") and not Path(path).expanduser().is_dir()


def gguf_checkpoint(
    path: str | Path, *, dtype: object = None, tokenizer: bool = False
) -> tuple[GGUFConfig, dict[str, np.ndarray], FastTokenizer | None]:
    """`(config, state_dict, tokenizer or None)` of the GGUF file at `path`.

    The config and state dict are those of the HuggingFace checkpoint of the same family
    (Llama, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3): llama.cpp's names renamed, its q/k row
    order and Gemma's norm offset undone, every tensor dequantized by the `gguf` package to
    float32, or to bfloat16 when `dtype` is `"bfloat16"`. With `tokenizer`, the
    tokenizer built from the file's `tokenizer.ggml.*` metadata, with its chat template.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    gguf = read_gguf(path)
    config = hf_config(gguf)
    factors = rope_factor_names(gguf)
    for name in set(gguf.tensors) - factors:  # refuse a tensor with no place before reading
        hf_name(gguf, name)
    built = gguf_tokenizer(gguf) if tokenizer else None
    host = HOST_DTYPES.get(str(dtype), np.float32)
    arrays = hf_state_dict(gguf, config, dict(read_tensors(gguf, host)))
    return config, arrays, built
