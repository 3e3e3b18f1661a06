"""Tokenizers of pretrained checkpoints behind one small interface.

Both classes here have `vocab_size`, `pad_id`, `bos_id`, `eos_id`, `unk_id`, `encode`, `decode`,
`encode_batch` and `save`. GPT-2 uses tiktoken's `gpt2` encoding (a core dependency); BERT and
MarianMT use their HuggingFace tokenizer through `transformers.AutoTokenizer` (optional).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo.interop.files import CONFIG, INSTALL_HF, resolve

ZOO_TOKENIZER = "zoo_tokenizer.json"  # how `TiktokenTokenizer.save` names its encoding


class _Batching:
    """`encode_batch` for any tokenizer with `encode` and `pad_id`."""

    pad_id: int | None
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        raise NotImplementedError

    def _wrap(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        wrapped = list(ids)
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True but this tokenizer has no bos_id")
            wrapped.insert(0, self.bos_id)
        if add_eos:
            if self.eos_id is None:
                raise ValueError("add_eos=True but this tokenizer has no eos_id")
            wrapped.append(self.eos_id)
        return wrapped

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        length: int,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> np.ndarray:
        """Token ids `[batch, length]` (int32), right-padded with `pad_id`.

        Long texts are truncated before the bos/eos ids are added, so those always survive.
        """
        if self.pad_id is None:
            raise ValueError("this tokenizer has no pad_id, so it cannot pad a batch")
        room = length - int(add_bos) - int(add_eos)
        if room < 1:
            raise ValueError(f"length={length} leaves no room for text next to bos/eos")
        batch = np.full((len(texts), length), self.pad_id, dtype=np.int32)
        for row, text in enumerate(texts):
            ids = self.encode(text)[:room]
            ids = self._wrap(ids, add_bos, add_eos)
            batch[row, : len(ids)] = ids
        return batch


class TiktokenTokenizer(_Batching):
    """GPT-2's byte-level BPE through tiktoken. `<|endoftext|>` is bos, eos and pad."""

    def __init__(self, encoding: str = "gpt2"):
        import tiktoken

        self.encoding_name = encoding
        self.encoding = tiktoken.get_encoding(encoding)
        self.eos_id = self.encoding.eot_token
        self.bos_id = self.eos_id
        self.pad_id = self.eos_id
        self.unk_id = None  # byte-level BPE encodes every string

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        # encode_ordinary: "<|endoftext|>" typed in the text is text, not the special token
        return self._wrap(self.encoding.encode_ordinary(text), add_bos, add_eos)

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i != self.eos_id]
        return self.encoding.decode(ids)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ZOO_TOKENIZER, "w") as handle:
            json.dump({"kind": "tiktoken", "encoding": self.encoding_name}, handle)


class HFTokenizer(_Batching):
    """A transformers tokenizer (WordPiece for BERT, SentencePiece for Marian).

    BERT has no bos/eos tokens: `[CLS]` and `[SEP]` stand in for them, so
    `encode(text, add_bos=True, add_eos=True)` is BERT's `[CLS] text [SEP]`.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        t = tokenizer
        self.pad_id = t.pad_token_id
        self.bos_id = t.bos_token_id if t.bos_token_id is not None else t.cls_token_id
        self.eos_id = t.eos_token_id if t.eos_token_id is not None else t.sep_token_id
        self.unk_id = t.unk_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self._wrap(list(ids), add_bos, add_eos)

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def save(self, directory: str | Path) -> None:
        self.tokenizer.save_pretrained(str(directory))


def load_tokenizer(name_or_dir: str | Path, *, revision: str | None = None) -> Any:
    """The tokenizer of a checkpoint folder or hub name.

    GPT-2 checkpoints with the standard 50257-token vocabulary get `TiktokenTokenizer("gpt2")`;
    everything else gets `HFTokenizer` around `transformers.AutoTokenizer` (Marian's also needs
    `sentencepiece`).
    """
    folder = resolve(name_or_dir, revision=revision, tokenizer=True)
    saved = folder / ZOO_TOKENIZER
    if saved.is_file():
        with open(saved) as handle:
            return TiktokenTokenizer(json.load(handle)["encoding"])
    config = {}
    if (folder / CONFIG).is_file():
        with open(folder / CONFIG) as handle:
            config = json.load(handle)
    if config.get("model_type") == "gpt2" and config.get("vocab_size", 50257) == 50257:
        return TiktokenTokenizer("gpt2")
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError(
            f"the tokenizer in {folder} loads through transformers: {INSTALL_HF}"
        ) from error
    try:
        return HFTokenizer(AutoTokenizer.from_pretrained(str(folder)))
    except (ImportError, ValueError) as error:
        raise RuntimeError(
            f"transformers could not load the tokenizer in {folder} ({error}); Marian's "
            "SentencePiece tokenizer also needs `pip install sentencepiece`"
        ) from error
