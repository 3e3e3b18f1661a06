"""`CharTokenizer`: one id per character, the vocabulary learnt from a corpus."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from zoo.data.tokenizers.base import VocabularyTokenizer, state_entry
from zoo.files import JSONObject


class CharTokenizer(VocabularyTokenizer):
    """One id per character. Ids 0-3 are <pad>, <bos>, <eos>, <unk>; characters follow."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        unique = sorted(set(chars))
        if any(len(c) != 1 for c in unique):
            raise ValueError("CharTokenizer takes single characters")
        self.chars = unique
        self._index = {c: i + len(self.SPECIALS) for i, c in enumerate(unique)}

    @classmethod
    def from_corpus(cls, texts: Iterable[str]) -> CharTokenizer:
        """Every character that occurs in `texts`."""
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise ValueError("cannot build a character vocabulary from an empty corpus")
        return cls(seen)

    @property
    def vocab_size(self) -> int:
        return len(self.SPECIALS) + len(self.chars)

    def _encode(self, text: str) -> list[int]:
        unk = self.unk_id  # once: a property call per character is slow on long texts
        return [self._index.get(c, unk) for c in text]

    def _decode(self, ids: Sequence[int]) -> str:
        offset = len(self.SPECIALS)
        return "".join(self.chars[i - offset] if i >= offset else self.SPECIALS[i] for i in ids)

    def state(self) -> JSONObject:
        return {"chars": "".join(self.chars)}

    @classmethod
    def from_state(cls, state: JSONObject) -> CharTokenizer:
        return cls(state_entry(state, "chars", str))


__all__ = ["CharTokenizer"]
