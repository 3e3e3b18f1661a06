"""`build_tokenizer(kind, texts=...)`: a tokenizer from its name, as the CLI spells it.

| kind | tokenizer | needs texts | options |
| --- | --- | --- | --- |
| `char` | `CharTokenizer` | yes | none |
| `word` | `WordTokenizer` | yes | `min_freq`, `max_size`, `lowercase`, `nfkc` |
| `tiktoken:NAME` | `TiktokenTokenizer(NAME)` (`tiktoken` alone: gpt2) | no | none |
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.char import CharTokenizer
from zoo.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer
from zoo.data.tokenizers.word import WordOptions, WordTokenizer

TOKENIZER_KINDS = ("char", "word", "tiktoken:NAME")
WORD_OPTIONS = tuple(WordOptions.__annotations__)  # min_freq, max_size, lowercase, nfkc


def build_tokenizer(
    kind: str, texts: Iterable[str] | None = None, **options: Unpack[WordOptions]
) -> Tokenizer:
    """A tokenizer of `kind` (char | word | tiktoken:NAME), learnt from `texts` where it needs to.

    `options` go to the tokenizer (`min_freq=2` for words, see the table in this module).
    """
    name, _, argument = kind.partition(":")
    if name == "tiktoken":
        _no_options(kind, options, allowed=())  # a fixed encoding: texts are not needed
        return TiktokenTokenizer(argument or "gpt2")
    if argument or name not in ("char", "word"):
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {list(TOKENIZER_KINDS)}")
    if texts is None:
        raise ValueError(f"a {name!r} tokenizer learns its vocabulary: pass texts=[...]")
    if name == "char":
        _no_options(kind, options, allowed=())
        return CharTokenizer.from_corpus(texts)
    _no_options(kind, options, allowed=WORD_OPTIONS)
    return WordTokenizer.from_corpus(texts, **options)


def _no_options(kind: str, options: WordOptions, *, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        valid = f"valid options: {list(allowed)}" if allowed else "it takes no options"
        raise TypeError(f"tokenizer kind {kind!r} got unknown options {unknown}; {valid}")
