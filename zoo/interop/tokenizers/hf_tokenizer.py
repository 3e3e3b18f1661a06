"""Tokenizers of pretrained checkpoints, behind zoo's one tokenizer interface.

GPT-2 uses tiktoken's `gpt2` encoding with the checkpoint's own 50257-id vocabulary
(`TiktokenTokenizer("gpt2", pretrained=True)`); Llama, Mistral, Qwen2 and Qwen3 (SmolLM2 is a
llama), T5 (its SentencePiece Unigram, with the pad id as bos: T5's decoder start), RoBERTa,
XLM-R and DistilBERT read their `tokenizer.json` with the tokenizers library (`FastTokenizer`);
BERT and
MarianMT use their HuggingFace tokenizer through `transformers.AutoTokenizer`, wrapped in
`HFTokenizer`. The last two are optional (`pip install 'jax-transformer-zoo[hf]'`). All save next to a model
and come back with `zoo.data.load_tokenizer`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from zoo.data.tokenizers.base import TOKENIZER_FILE, Tokenizer, load_tokenizer
from zoo.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer
from zoo.files import JSONObject
from zoo.interop.files import CONFIG, INSTALL_HF, json_id, read_json, resolve
from zoo.interop.tokenizers.fast_tokenizer import FastTokenizer

# model_type values whose checkpoints ship a tokenizer.json that FastTokenizer reads
FAST_TOKENIZER_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "phi3",
)
# the encoders' hub snapshots ship one too; older BERT folders may hold only vocab.txt
ENCODER_TOKENIZER_TYPES = ("roberta", "xlm-roberta", "distilbert", "modernbert")


@runtime_checkable
class TransformersTokenizer(Protocol):
    """What `HFTokenizer` uses of a `transformers` tokenizer (`AutoTokenizer.from_pretrained`)."""

    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None
    cls_token_id: int | None
    sep_token_id: int | None
    unk_token_id: int | None

    def __len__(self) -> int: ...

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool) -> str | list[str]: ...

    def save_pretrained(self, directory: str, /) -> object: ...


class HFTokenizer(Tokenizer):
    """A transformers tokenizer (WordPiece for BERT, SentencePiece for Marian).

    BERT has no bos/eos tokens: `[CLS]` and `[SEP]` stand in for them, so
    `encode(text, add_bos=True, add_eos=True)` is BERT's `[CLS] text [SEP]`.
    """

    kind = "hf"

    def __init__(self, tokenizer: TransformersTokenizer):
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_id(self) -> int:
        if self.tokenizer.pad_token_id is None:
            raise ValueError("this HuggingFace tokenizer has no pad token")
        return self.tokenizer.pad_token_id

    @property
    def bos_id(self) -> int | None:
        t = self.tokenizer
        return t.bos_token_id if t.bos_token_id is not None else t.cls_token_id

    @property
    def puts_bos_first(self) -> bool:
        """Whether the transformers tokenizer's own encoding starts with bos (or `[CLS]`)."""
        bos = self.bos_id
        return bos is not None and self.tokenizer.encode("", add_special_tokens=True)[:1] == [bos]

    @property
    def eos_id(self) -> int | None:
        t = self.tokenizer
        return t.eos_token_id if t.eos_token_id is not None else t.sep_token_id

    @property
    def unk_id(self) -> int | None:
        return self.tokenizer.unk_token_id

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: Sequence[int]) -> str:
        return _text(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def decode(self, ids: Iterable[int] | npt.ArrayLike, *, skip_special: bool = True) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if skip_special and self.eos_id is not None and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return _text(self.tokenizer.decode(ids, skip_special_tokens=skip_special))

    def save(self, directory: str | os.PathLike) -> Path:
        """The HuggingFace files plus `zoo_tokenizer.json` pointing at them."""
        self.tokenizer.save_pretrained(str(directory))
        return super().save(directory)

    def state(self) -> JSONObject:
        return {}

    @classmethod
    def from_state(cls, state: JSONObject) -> HFTokenizer:
        raise ValueError("an HFTokenizer is rebuilt from its folder: use load_tokenizer(folder)")

    @classmethod
    def from_saved(cls, state: JSONObject, directory: Path | None) -> HFTokenizer:
        if directory is None:
            return cls.from_state(state)
        return cls(_auto_tokenizer(directory))


def _text(decoded: str | list[str]) -> str:
    """transformers decodes one sequence of ids to a str (a batch would give a list)."""
    return decoded if isinstance(decoded, str) else "".join(decoded)


def _auto_tokenizer(folder: Path) -> TransformersTokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError(
            f"the tokenizer in {folder} loads through transformers: {INSTALL_HF}"
        ) from error
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (ImportError, ValueError) as error:
        raise RuntimeError(
            f"transformers could not load the tokenizer in {folder} ({error}); Marian's "
            "SentencePiece tokenizer also needs `pip install sentencepiece`"
        ) from error


def pretrained_tokenizer(name_or_dir: str | Path, *, revision: str | None = None) -> Tokenizer:
    """The tokenizer of a checkpoint folder or hub name.

    A folder saved by zoo (`zoo_tokenizer.json`) loads as saved; GPT-2 checkpoints with the
    standard 50257-id vocabulary get tiktoken's `gpt2`; Llama, Mistral, Qwen, T5, RoBERTa, XLM-R,
    DistilBERT and ModernBERT checkpoints get `FastTokenizer` (their `tokenizer.json`);
    everything else gets `HFTokenizer`.
    """
    folder = resolve(name_or_dir, revision=revision, tokenizer=True)
    if (folder / TOKENIZER_FILE).is_file():
        return load_tokenizer(folder)
    config = read_json(folder / CONFIG, missing_ok=True)
    if config.get("model_type") == "gpt2" and config.get("vocab_size", 50257) == 50257:
        return TiktokenTokenizer("gpt2", pretrained=True)
    if config.get("model_type") in ("t5", "mt5"):  # targets start from the decoder start (pad) id
        name = "decoder_start_token_id" if "decoder_start_token_id" in config else "pad_token_id"
        start = json_id(config.get(name, 0), name, folder / CONFIG)
        return FastTokenizer.from_folder(folder, start_id=start)
    if config.get("model_type") in (*FAST_TOKENIZER_TYPES, *ENCODER_TOKENIZER_TYPES):
        return FastTokenizer.from_folder(folder)
    return HFTokenizer(_auto_tokenizer(folder))
