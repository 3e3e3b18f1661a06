"""Two tokenizers for translation: one for the source language, one for the target.

A `PairTokenizer` is a `Tokenizer` that behaves as its target tokenizer (what a translator
decodes) and carries the source tokenizer as `.source`. It saves both in one `zoo_tokenizer.json`
(`{"kind": "pair", "state": {"source": {...}, "target": {...}}}`), so `zoo.save(model,
tokenizer=pair)` and `load_tokenizer(directory)` need nothing special. A translator that shares
one vocabulary between the languages uses a plain tokenizer instead; `source_tokenizer` and
`target_tokenizer` give the right half of either.
"""

from __future__ import annotations

from collections.abc import Sequence

from zoo.data.tokenizers.base import (
    Tokenizer,
    state_object,
    tokenizer_from_dict,
    tokenizer_to_dict,
)
from zoo.files import JSONObject


class PairTokenizer(Tokenizer):
    """Source and target tokenizers; as a `Tokenizer` it is the target one.

    The translator has one `pad_id` for both vocabularies, so both halves must agree on it.
    """

    kind = "pair"

    def __init__(self, source: Tokenizer, target: Tokenizer):
        for name, half in (("source", source), ("target", target)):
            if isinstance(half, PairTokenizer):
                raise TypeError(f"the {name} of a PairTokenizer must be a single tokenizer")
        if source.pad_id != target.pad_id:
            raise ValueError(
                f"source pad_id {source.pad_id} differs from target pad_id {target.pad_id}; the "
                "translator pads both sides with one id: use tokenizers of the same kind, or "
                "one shared tokenizer"
            )
        self.source = source
        self.target = target

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def pad_id(self) -> int:
        return self.target.pad_id

    @property
    def bos_id(self) -> int | None:
        return self.target.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.target.eos_id

    @property
    def unk_id(self) -> int | None:
        return self.target.unk_id

    def _encode(self, text: str) -> list[int]:
        return self.target.encode(text)

    def encode_many(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        return self.target.encode_many(texts, add_bos=add_bos, add_eos=add_eos)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.target.decode(ids, skip_special=False)

    def state(self) -> JSONObject:
        return {"source": tokenizer_to_dict(self.source), "target": tokenizer_to_dict(self.target)}

    @classmethod
    def from_state(cls, state: JSONObject) -> PairTokenizer:
        return cls(
            tokenizer_from_dict(
                state_object(state, "source"), source="the source half of a pair tokenizer"
            ),
            tokenizer_from_dict(
                state_object(state, "target"), source="the target half of a pair tokenizer"
            ),
        )


def source_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer for source text: `.source` of a pair, else the tokenizer itself."""
    return tokenizer.source if isinstance(tokenizer, PairTokenizer) else tokenizer


def target_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer for target text: `.target` of a pair, else the tokenizer itself."""
    return tokenizer.target if isinstance(tokenizer, PairTokenizer) else tokenizer
