"""GGUF files (llama.cpp, Ollama, LM Studio) in, read with the `gguf` package (extra `gguf`).

- `zoo.from_pretrained("model.gguf", return_tokenizer=True)`: a `zoo.GPT` and its tokenizer,
  from `gguf_checkpoint(path)`: the HuggingFace config and state dict the file holds.
- `read_gguf(path)`: the file's metadata and tensor table (`gguf.GGUFReader`, run inside
  bounds); `read_tensors` dequantizes the tensors (`gguf.quants.dequantize`).
- `supported_names()`: the tensor types the installed `gguf` package dequantizes (F32, F16,
  BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants Q2_K..Q6_K, and more in recent releases).
- `GGUFError`: a file refused, with its name and the reason.
"""

from zoo.interop.gguf.load import gguf_checkpoint, is_gguf
from zoo.interop.gguf.quants import dequantize, supported_names
from zoo.interop.gguf.reader import GGUFError, GGUFFile, TensorInfo, read_gguf, read_tensors
from zoo.interop.gguf.tokenizer import gguf_tokenizer

__all__ = [
    "GGUFError",
    "GGUFFile",
    "TensorInfo",
    "dequantize",
    "gguf_checkpoint",
    "gguf_tokenizer",
    "is_gguf",
    "read_gguf",
    "read_tensors",
    "supported_names",
]
