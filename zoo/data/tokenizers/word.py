"""Word-level tokenizer: the classic tutorials' vocabulary of words seen at least `min_freq` times.

Text is (optionally) NFKC-normalised and lowercased, split by a regex into words and single
punctuation marks, and each piece looked up in the vocabulary (unknown pieces become `<unk>`).
Decoding rejoins the pieces with spaces, except around punctuation that sits against a word
("dog ." -> "dog.", "( a )" -> "(a)", "T - shirt" -> "T-shirt").
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TypedDict

from zoo.data.tokenizers.base import VocabularyTokenizer, state_entry, state_texts
from zoo.files import JSONObject

# A word is a run of letters/digits, possibly with inner apostrophes ("don't", "film's");
# anything else that is not a space is a piece on its own.
WORD_PATTERN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")
# Punctuation that hugs the piece before it, the piece after it, or both.
CLOSING = frozenset(".,;:!?%)]}…»")
OPENING = frozenset("([{$#«¿¡")
JOINING = frozenset("-/")  # "T-shirt", "and/or"; a spaced dash stays spaced
QUOTES = frozenset("\"'")


class WordOptions(TypedDict, total=False):
    """The options of `WordTokenizer.from_corpus` (`build_tokenizer("word", texts, **options)`)."""

    min_freq: int
    max_size: int | None
    lowercase: bool
    nfkc: bool


def split_words(text: str) -> list[str]:
    """Words and punctuation marks of `text`, in order."""
    return WORD_PATTERN.findall(text)


def join_words(pieces: Sequence[str]) -> str:
    """Inverse of `split_words` up to spacing: `join_words(split_words(s))` is `s` tidied."""
    out: list[str] = []
    glue_next = True  # no space before the first piece
    open_quotes: set[str] = set()
    for piece in pieces:
        glue_before = glue_next or piece in CLOSING or piece in JOINING
        glue_next = piece in OPENING or piece in JOINING
        if piece in QUOTES:
            if piece in open_quotes:  # a closing quote hugs the word before it
                open_quotes.discard(piece)
                glue_before = True
            else:  # an opening quote hugs the word after it
                open_quotes.add(piece)
                glue_next = True
        out.append(piece if glue_before else " " + piece)
    return "".join(out)


class WordTokenizer(VocabularyTokenizer):
    """One id per word. Ids 0-3 are <pad>, <bos>, <eos>, <unk>; words follow, most frequent first.

    Build one with `WordTokenizer.from_corpus(texts, min_freq=2)`.
    """

    kind = "word"

    def __init__(self, words: Sequence[str], *, lowercase: bool = False, nfkc: bool = True):
        words = list(words)
        clash = sorted(set(words) & set(self.SPECIALS))
        if clash:
            raise ValueError(f"the vocabulary may not contain the special tokens {clash}")
        if len(set(words)) != len(words):
            raise ValueError("the vocabulary lists a word twice")
        self.words = words
        self.lowercase = lowercase
        self.nfkc = nfkc
        self._index = {word: i + len(self.SPECIALS) for i, word in enumerate(words)}

    @classmethod
    def from_corpus(
        cls,
        texts: Iterable[str],
        *,
        min_freq: int = 1,
        max_size: int | None = None,
        lowercase: bool = False,
        nfkc: bool = True,
    ) -> WordTokenizer:
        """Words seen at least `min_freq` times in `texts`, the `max_size` most frequent of them.

        Ties in frequency are broken alphabetically, so the same corpus gives the same ids.
        """
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        if max_size is not None and max_size < 1:
            raise ValueError(f"max_size must be >= 1 (or None for no limit), got {max_size}")
        counts: Counter[str] = Counter()
        normalizer = cls([], lowercase=lowercase, nfkc=nfkc)
        for text in texts:
            counts.update(split_words(normalizer.normalize_text(text)))
        if not counts:
            raise ValueError("cannot build a word vocabulary from an empty corpus")
        kept = sorted(
            (w for w, n in counts.items() if n >= min_freq), key=lambda w: (-counts[w], w)
        )
        if not kept:
            raise ValueError(
                f"no word occurs min_freq={min_freq} times in the corpus "
                f"(the most frequent occurs {max(counts.values())} times); lower min_freq"
            )
        kept = [w for w in kept if w not in cls.SPECIALS]
        return cls(kept[:max_size], lowercase=lowercase, nfkc=nfkc)

    def normalize_text(self, text: str) -> str:
        """`text` after NFKC and lowercasing (each when enabled)."""
        if self.nfkc:
            text = unicodedata.normalize("NFKC", text)
        return text.lower() if self.lowercase else text

    def canonical(self, text: str) -> str:
        """What `decode(encode(text))` gives when every word is in the vocabulary."""
        return join_words(split_words(self.normalize_text(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.SPECIALS) + len(self.words)

    def _encode(self, text: str) -> list[int]:
        # normalize_text and split_words, inlined: this runs once per example of a corpus.
        if self.nfkc:
            text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        index, unk = self._index, self.SPECIALS.index("<unk>")
        return [index.get(piece, unk) for piece in WORD_PATTERN.findall(text)]

    def _decode(self, ids: Sequence[int]) -> str:
        offset, size = len(self.SPECIALS), self.vocab_size
        for i in ids:
            if not 0 <= i < size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {size})")
        return join_words(
            [self.words[i - offset] if i >= offset else self.SPECIALS[i] for i in ids]
        )

    def state(self) -> JSONObject:
        return {"words": list(self.words), "lowercase": self.lowercase, "nfkc": self.nfkc}

    @classmethod
    def from_state(cls, state: JSONObject) -> WordTokenizer:
        return cls(
            state_texts(state, "words"),
            lowercase=state_entry(state, "lowercase", bool),
            nfkc=state_entry(state, "nfkc", bool),
        )
