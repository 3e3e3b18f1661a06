"""RoBERTa, XLM-R and DistilBERT tokenizers read from `tokenizer.json` by `FastTokenizer` give the
ids of `transformers.AutoTokenizer` on the same folder (built offline: encoder_tokenizer_folders)."""

from __future__ import annotations

from pathlib import Path

import pytest
from encoder_tokenizer_folders import FOLDERS, SAMPLE

from zoo.data import load_tokenizer
from zoo.interop import FastTokenizer, pretrained_tokenizer

pytestmark = pytest.mark.hf
TEXTS = [*SAMPLE, "Unseen WORDS: zebra 42 x", "  spaces  and\ttabs ", "<mask> inside"]
# family -> (bos, eos, pad, unk) ids: RoBERTa's <s> </s> <pad> <unk>; DistilBERT's [CLS] [SEP]
IDS = {"roberta": (0, 2, 1, 3), "xlm-roberta": (0, 2, 1, 3), "distilbert": (2, 3, 0, 1)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoder-snapshots")
    return {name: build(root / name) for name, build in FOLDERS.items()}


@pytest.mark.parametrize("family", list(FOLDERS))
def test_ids_equal_auto_tokenizer(folders, family):
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    tok = pretrained_tokenizer(folders[family])
    reference = transformers.AutoTokenizer.from_pretrained(str(folders[family]))
    assert isinstance(tok, FastTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == IDS[family]
    assert tok.mask_id == reference.mask_token_id and tok.vocab_size == len(reference)
    for text in TEXTS:
        assert tok.encode(text, add_bos=True, add_eos=True) == reference(text)["input_ids"], text
    assert tok.encode("the movie") == reference("the movie", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", list(FOLDERS))
def test_saved_tokenizer_keeps_its_special_ids(folders, family, tmp_path):
    tok = pretrained_tokenizer(folders[family])
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, FastTokenizer) and again.mask_id == tok.mask_id
    assert (again.bos_id, again.eos_id, again.pad_id) == IDS[family][:3]
    assert again.encode(SAMPLE[1]) == tok.encode(SAMPLE[1])
