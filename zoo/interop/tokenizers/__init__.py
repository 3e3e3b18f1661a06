"""HuggingFace tokenizers behind zoo's `Tokenizer` interface, and the files that go with them.

- `fast_tokenizer`: `FastTokenizer`, a `tokenizer.json` read by the `tokenizers` library (Llama,
  Mistral, Qwen, SmolLM2), with its special tokens and chat template;
- `hf_tokenizer`: `HFTokenizer`, transformers' own tokenizer (BERT, Marian), and
  `pretrained_tokenizer(name_or_dir)`, which picks the right one for a checkpoint;
- `generation_config`: the `generation_config.json` and tokenizer files an export writes.
"""

from zoo.interop.tokenizers.fast_tokenizer import FastTokenizer
from zoo.interop.tokenizers.hf_tokenizer import HFTokenizer, pretrained_tokenizer

__all__ = ["FastTokenizer", "HFTokenizer", "pretrained_tokenizer"]
