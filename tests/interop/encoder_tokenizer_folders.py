"""Tiny tokenizer folders laid out like the hub snapshots of RoBERTa, XLM-R and DistilBERT.

Each trains a small vocabulary with the tokenizers library on `SAMPLE` (no network) with the
checkpoint's own pipeline (byte-level BPE, SentencePiece-style Unigram, lowercased WordPiece)
and writes `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` and
`config.json` as those repositories have them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers library (zoo[hf])")
from tokenizers import (  # noqa: E402
    AddedToken,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

SAMPLE = [
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "A gorgeous, witty, seductive movie; unwatchable and overlong.",
    "Größere Übungen für Bäcker: Ärger, Öl und süße Straße.",
    "the film's unbelievably well-acted performances are its strengths",
]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0-3, <mask> comes last


def _write(folder: Path, tokenizer: Any, files: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False))
    return folder


def _roberta_files(model_type: str, tokenizer_class: str, vocab_size: int) -> dict[str, Any]:
    roles = dict(
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    return {
        "tokenizer_config.json": {**roles, "tokenizer_class": tokenizer_class},
        "special_tokens_map.json": roles,
        "config.json": {"model_type": model_type, "pad_token_id": 1, "vocab_size": vocab_size},
    }


def _with_mask(tokenizer: Any) -> None:
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))


def roberta_folder(folder: Path) -> Path:
    """RoBERTa: byte-level BPE, <s> text </s>, `<mask>` the last id."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=ROBERTA_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SAMPLE * 3, trainer)
    _with_mask(tokenizer)
    size = tokenizer.get_vocab_size()
    return _write(folder, tokenizer, _roberta_files("roberta", "RobertaTokenizer", size))


def xlm_roberta_folder(folder: Path) -> Path:
    """XLM-R: a SentencePiece-style Unigram with ▁ word starts, RoBERTa's special tokens.

    The hub file's normalizer is a precompiled SentencePiece table that cannot be built offline;
    runs of spaces collapse as they do there (transformers 5 rebuilds this pipeline the same way).
    """
    tokenizer = tokenizers.Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=200, special_tokens=ROBERTA_SPECIALS, unk_token="<unk>"
    )
    tokenizer.train_from_iterator(SAMPLE * 3, trainer)
    _with_mask(tokenizer)
    size = tokenizer.get_vocab_size()
    return _write(folder, tokenizer, _roberta_files("xlm-roberta", "XLMRobertaTokenizer", size))


def distilbert_folder(folder: Path) -> Path:
    """DistilBERT uncased: lowercased WordPiece, [CLS] text [SEP], no bos or eos token."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(
        SAMPLE * 3, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials)
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    roles = dict(
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    config = {**roles, "do_lower_case": True, "tokenizer_class": "DistilBertTokenizer"}
    model = {"model_type": "distilbert", "vocab_size": tokenizer.get_vocab_size()}
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": config,
            "special_tokens_map.json": roles,
            "config.json": model,
        },
    )


FOLDERS = {
    "roberta": roberta_folder,
    "xlm-roberta": xlm_roberta_folder,
    "distilbert": distilbert_folder,
}
