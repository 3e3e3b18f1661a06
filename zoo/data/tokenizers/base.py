"""The tokenizer interface every zoo tokenizer follows, and saving/loading by kind.

A tokenizer turns text into token ids and back, knows its special ids (pad, bos, eos, unk) and
its vocabulary size, encodes batches to fixed-length padded arrays, and saves itself as
`zoo_tokenizer.json` next to a model.
"""

from __future__ import annotations

import abc
import importlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from zoo.files import JSONObject, JSONValue, read_json_object, write_text_atomic

TOKENIZER_FILE = "zoo_tokenizer.json"  # not "tokenizer.json": that is HF's fast-tokenizer file
UNKNOWN_WARNING_RATE = 0.1  # warn when more than this fraction of a text's tokens is <unk>
logger = logging.getLogger(__name__)
_KINDS: dict[str, type[Tokenizer]] = {}
# Each kind registers itself when its module is first imported; a saved tokenizer names its kind,
# so loading imports the module that defines it.
_KIND_MODULES = {
    "char": "zoo.data.tokenizers.char",
    "word": "zoo.data.tokenizers.word",
    "tiktoken": "zoo.data.tokenizers.tiktoken_tokenizer",
    "pair": "zoo.data.tokenizers.pair",
    "hf": "zoo.interop.tokenizers.hf_tokenizer",
    "tokenizer.json": "zoo.interop.tokenizers.fast_tokenizer",
}
Entry = TypeVar("Entry", str, bool, int)


class Tokenizer(abc.ABC):
    """Text <-> token ids. Subclasses set `kind` and implement the abstract methods."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _KINDS[cls.kind] = cls

    # -- what a subclass provides ------------------------------------------------------------

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids a model must accept (ids are in [0, vocab_size))."""

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int | None:
        return None

    @property
    def eos_id(self) -> int | None:
        return None

    @property
    def unk_id(self) -> int | None:
        return None

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a text, `eos_id` first (Llama 3 instruct stops on three)."""
        return () if self.eos_id is None else (self.eos_id,)

    @abc.abstractmethod
    def _encode(self, text: str) -> list[int]:
        """Ids of `text`, without special tokens."""

    @abc.abstractmethod
    def _decode(self, ids: Sequence[int]) -> str:
        """Text of ids that are not special tokens."""

    @abc.abstractmethod
    def state(self) -> JSONObject:
        """JSON-serialisable state; `cls.from_state(state)` rebuilds the tokenizer."""

    @classmethod
    @abc.abstractmethod
    def from_state(cls, state: JSONObject) -> Tokenizer: ...

    @classmethod
    def from_saved(cls, state: JSONObject, directory: Path | None) -> Tokenizer:
        """Rebuild from `state` read in `directory` (for kinds that keep files beside it)."""
        return cls.from_state(state)

    # -- shared behaviour --------------------------------------------------------------------

    @property
    def puts_bos_first(self) -> bool:
        """Whether the tokenizer's own encoding of a text starts with bos (transformers'
        `add_special_tokens=True`): zoo's tokenizers do wherever they have one; a checkpoint's
        may declare a bos token and not add it (no bos in its post-processor)."""
        return self.bos_id is not None

    @property
    def special_ids(self) -> set[int]:
        ids = (self.pad_id, self.bos_id, self.eos_id)
        return {i for i in ids if i is not None}

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self._encode(text)
        if add_bos:
            ids = [_required(self.bos_id, "bos_id"), *ids]
        if add_eos:
            ids = [*ids, _required(self.eos_id, "eos_id")]
        return ids

    def encode_many(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """`encode` of every text, in one call (tokenizers that can encode batches faster do)."""
        prefix = [_required(self.bos_id, "bos_id")] if add_bos else []
        suffix = [_required(self.eos_id, "eos_id")] if add_eos else []
        return [[*prefix, *ids, *suffix] for ids in self._encode_many(texts)]

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """`_encode` of every text (a tokenizer with a faster batch encoder overrides this)."""
        return [self._encode(text) for text in texts]

    def decode(self, ids: Iterable[int] | npt.ArrayLike, *, skip_special: bool = True) -> str:
        """Text of `ids` (a list or a 1-D array); stops at the first of `eos_ids` and drops
        `special_ids` (pad, bos, eos) when `skip_special`."""
        array = np.asarray(ids if hasattr(ids, "shape") else list(ids))  # type: ignore[arg-type]
        if array.ndim != 1:
            raise ValueError(f"decode takes one sequence of ids (1-D), got shape {array.shape}")
        ids = [int(i) for i in array]
        if skip_special:
            # Some tokenizers (gpt2) use one id for bos and eos: a leading bos is not the end.
            if self.bos_id is not None and ids[:1] == [self.bos_id]:
                ids = ids[1:]
            ends = set(self.eos_ids)
            ids = next((ids[:at] for at, i in enumerate(ids) if i in ends), ids)
            special = self.special_ids
            ids = [i for i in ids if i not in special]
        return self._decode(ids)

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        length: int,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> np.ndarray:
        """`int32[batch, length]`: each text encoded, truncated to `length`, padded with pad_id.

        Truncation keeps the eos token (when `add_eos`) as the last id.
        """
        out = np.full((len(texts), length), self.pad_id, dtype=np.int32)
        for row, ids in enumerate(self.encode_many(texts, add_bos=add_bos, add_eos=add_eos)):
            ids = truncate(ids, length, add_eos)
            out[row, : len(ids)] = ids
        return out

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `directory/zoo_tokenizer.json` (atomically)."""
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(tokenizer_to_dict(self)))
        return path


def truncate(ids: list[int], length: int, keep_last: bool) -> list[int]:
    """`ids` cut to `length`; with `keep_last`, the final id (eos) survives the cut."""
    if len(ids) <= length:
        return ids
    return [*ids[: length - 1], ids[-1]] if keep_last else ids[:length]


def _required(value: int | None, name: str) -> int:
    if value is None:
        raise ValueError(f"this tokenizer has no {name}")
    return value


def unknown_rate(tokenizer: Tokenizer, texts: Iterable[str]) -> float | None:
    """The fraction of the tokens of `texts` that are `unk_id`; None for a tokenizer without one
    (byte-level BPE such as tiktoken encodes any text)."""
    unk = tokenizer.unk_id
    if unk is None:
        return None
    rows = tokenizer.encode_many(list(texts))
    total = sum(len(row) for row in rows)
    return sum(row.count(unk) for row in rows) / total if total else 0.0


def warn_unknown(tokenizer: Tokenizer, texts: Iterable[str], what: str) -> float | None:
    """`unknown_rate`, logged as a warning over `UNKNOWN_WARNING_RATE` (`what` names the texts)."""
    rate = unknown_rate(tokenizer, texts)
    if rate is not None and rate > UNKNOWN_WARNING_RATE:
        logger.warning(
            "%.0f%% of the tokens of %s are unknown to the tokenizer (<unk>): the text is mostly "
            "outside the vocabulary the model was trained on (another language, casing or "
            "corpus?), so its outputs on it mean little",
            100 * rate,
            what,
        )
    return rate


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer saved in `directory/zoo_tokenizer.json`."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}")
    fix = "save the model again with its tokenizer (zoo.save(model, dir, tokenizer=...))"
    data = read_json_object(path, fix=fix)
    try:
        return tokenizer_from_dict(data, source=str(path), directory=Path(directory))
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path} is damaged (missing or wrong entry {error}); {fix}") from None


def tokenizer_to_dict(tokenizer: Tokenizer) -> JSONObject:
    """`{"kind": ..., "state": ...}`: what `zoo_tokenizer.json` holds."""
    return {"kind": tokenizer.kind, "state": tokenizer.state()}


def tokenizer_from_dict(
    data: JSONObject, *, source: str = "tokenizer data", directory: Path | None = None
) -> Tokenizer:
    """Rebuild a tokenizer from `tokenizer_to_dict` output; `source` names it in errors."""
    kind = data.get("kind")
    if isinstance(kind, str) and kind not in _KINDS and kind in _KIND_MODULES:
        importlib.import_module(_KIND_MODULES[kind])
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r} in {source}; known: {sorted(_KINDS)}")
    return _KINDS[kind].from_saved(state_object(data, "state"), directory)


def state_entry(
    state: JSONObject, name: str, kind: type[Entry], default: Entry | None = None
) -> Entry:
    """`state[name]` (`default` where it is absent and one is given), which must be a `kind`:
    otherwise a `TypeError` names the entry (`load_tokenizer` reports the file as damaged)."""
    value = state[name] if default is None else state.get(name, default)
    if not isinstance(value, kind):
        raise TypeError(f"{name!r} is {type(value).__name__}, expected {kind.__name__}")
    return value


def state_object(state: JSONObject, name: str) -> JSONObject:
    """`state[name]`, which must be a JSON object (a `TypeError` names the entry otherwise)."""
    value = state[name]
    if not isinstance(value, dict):
        raise TypeError(f"{name!r} is {type(value).__name__}, expected an object")
    return value


def state_texts(state: JSONObject, name: str) -> list[str]:
    """`state[name]`, which must be a list of strings (a `TypeError` names the entry otherwise)."""
    value: JSONValue = state[name]
    texts = [item for item in value if isinstance(item, str)] if isinstance(value, list) else []
    if not isinstance(value, list) or len(texts) != len(value):
        raise TypeError(f"{name!r} should be a list of strings, found {str(value)[:60]}")
    return texts


class VocabularyTokenizer(Tokenizer):
    """A tokenizer with its own vocabulary: ids 0-3 are <pad>, <bos>, <eos>, <unk>."""

    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def unk_id(self) -> int:
        return 3
