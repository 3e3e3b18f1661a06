"""Tokenizers: the `Tokenizer` interface and the kinds zoo builds itself.

- `base`: the interface (special ids, batch encoding, saving as `zoo_tokenizer.json`),
  `load_tokenizer`, and the registry of kinds a saved tokenizer names.
- `char`, `word`, `tiktoken_tokenizer`: one id per character, a learnt word vocabulary, and
  tiktoken's byte-pair encodings.
- `pair`: a source and a target tokenizer for translation.
- `build`: `build_tokenizer(kind, texts)`, by the name the CLI uses; `choose`: the tokenizer a
  task's data gets (it reads `datasets`, so it is imported on first use).

HuggingFace tokenizers (`tokenizer.json`, transformers' own) live in `zoo.interop.tokenizers`.
"""

from zoo.data.tokenizers.base import Tokenizer, load_tokenizer
from zoo.data.tokenizers.build import TOKENIZER_KINDS, build_tokenizer
from zoo.data.tokenizers.char import CharTokenizer
from zoo.data.tokenizers.pair import PairTokenizer, source_tokenizer, target_tokenizer
from zoo.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer
from zoo.data.tokenizers.word import WordTokenizer

__all__ = [
    "TOKENIZER_KINDS",
    "CharTokenizer",
    "PairTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "build_tokenizer",
    "load_tokenizer",
    "source_tokenizer",
    "target_tokenizer",
]
