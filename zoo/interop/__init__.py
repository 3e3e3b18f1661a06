"""HuggingFace interop: pretrained GPT-2, BERT and MarianMT weights in, and back out.

- `from_pretrained(name_or_dir, **overrides)`: a zoo model from a local checkpoint folder
  (`config.json` + safetensors, or `pytorch_model.bin` read with torch's weights-only loader) or
  a hub name, or a llama.cpp `.gguf` file (`zoo.interop.gguf`); `return_tokenizer=True` adds
  its tokenizer.
- `from_hf(hf_model)`: a zoo model from a transformers model object.
- `to_hf(model)`: `(state_dict, config)` that transformers loads; `save_hf(model, dir)` writes
  a folder `transformers.AutoModel.from_pretrained` reads.
- `pretrained_tokenizer(name_or_dir)`: tiktoken for GPT-2, `FastTokenizer` (`tokenizer.json`)
  for Llama, Mistral and Qwen, the HuggingFace tokenizer otherwise.

Loading safetensors needs neither torch nor transformers; `pytorch_model.bin` (torch >= 2.6),
`from_hf`, `to_hf` and the BERT and Marian tokenizers do (`pip install 'jax-transformer-zoo[hf]'`);
`FastTokenizer` needs only the tokenizers library (in the same extra).
"""

from zoo.interop.architecture import UnsupportedConfig, UnsupportedExport
from zoo.interop.convert import CheckpointMismatch
from zoo.interop.export import save_hf, to_hf, to_state_dict
from zoo.interop.loading import FreshWeightsWarning, from_hf, from_pretrained, load_state_dict
from zoo.interop.tokenizers.fast_tokenizer import FastTokenizer
from zoo.interop.tokenizers.hf_tokenizer import HFTokenizer, pretrained_tokenizer

__all__ = [
    "CheckpointMismatch",
    "FastTokenizer",
    "FreshWeightsWarning",
    "HFTokenizer",
    "UnsupportedConfig",
    "UnsupportedExport",
    "from_hf",
    "from_pretrained",
    "load_state_dict",
    "pretrained_tokenizer",
    "save_hf",
    "to_hf",
    "to_state_dict",
]
