"""ModernBERT's tokenizer folder, as its hub snapshot ships it: a byte-level BPE `tokenizer.json`
whose special tokens ([UNK], [CLS], [SEP], [PAD], [MASK]) sit at the end of the vocabulary, a
`[CLS] text [SEP]` post-processor and `PreTrainedTokenizerFast` in `tokenizer_config.json`.
`zoo.interop.pretrained_tokenizer` gives transformers' ids and special ids (built offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from encoder_tokenizer_folders import SAMPLE

from zoo.interop import FastTokenizer, pretrained_tokenizer

pytestmark = pytest.mark.hf
tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers library (zoo[hf])")
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
TEXTS = [*SAMPLE, "Unseen WORDS: zebra 42 x", "  spaces  and\ttabs ", "a [MASK] inside"]


def modernbert_folder(folder: Path) -> Path:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SAMPLE * 3, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, lstrip=t == "[MASK]") for t in SPECIALS]
    )
    ids = {t: tokenizer.token_to_id(t) for t in SPECIALS}
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    roles = dict(
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        unk_token="[UNK]",
    )
    files = {
        "tokenizer_config.json": {
            **roles,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 8192,
        },
        "special_tokens_map.json": roles,
        "config.json": {
            "model_type": "modernbert",
            "vocab_size": tokenizer.get_vocab_size(),
            "pad_token_id": ids["[PAD]"],
            "cls_token_id": ids["[CLS]"],
            "sep_token_id": ids["[SEP]"],
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2))
    return folder


def test_ids_equal_auto_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    folder = modernbert_folder(tmp_path / "modernbert")
    tok = pretrained_tokenizer(folder)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert isinstance(tok, FastTokenizer)
    assert (tok.pad_id, tok.mask_id, tok.unk_id) == (
        reference.pad_token_id,
        reference.mask_token_id,
        reference.unk_token_id,
    )
    assert tok.vocab_size == len(reference)
    for text in TEXTS:
        assert tok.encode(text, add_bos=True, add_eos=True) == reference(text)["input_ids"], text
        assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text
