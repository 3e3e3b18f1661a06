"""Tokenizers of pretrained checkpoints: tiktoken GPT-2 and a wrapped WordPiece BERT tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
from test_checkpoints import CONFIGS, random_checkpoint

from zoo.data import TiktokenTokenizer, load_tokenizer
from zoo.interop import HFTokenizer, from_pretrained, pretrained_tokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "a"]


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    try:
        return TiktokenTokenizer("gpt2", pretrained=True)
    except Exception as error:  # no network and no cached encoding
        pytest.skip(f"tiktoken's gpt2 encoding is not available offline: {error}")


def test_tiktoken_gpt2_encodes_known_ids(gpt2_tokenizer):
    tok = gpt2_tokenizer
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("Hello world", add_eos=True) == [15496, 995, 50256]
    assert (tok.vocab_size, tok.eos_id, tok.bos_id, tok.pad_id, tok.unk_id) == (
        50257,
        50256,
        50256,
        50256,
        None,
    )
    assert tok.decode([15496, 995, 50256]) == "Hello world"
    assert tok.decode([15496, 50256], skip_special=False) == "Hello<|endoftext|>"


def test_tiktoken_batches_truncate_but_keep_eos(gpt2_tokenizer):
    batch = gpt2_tokenizer.encode_batch(["Hello world, how are you", "Hi"], length=4, add_eos=True)
    assert batch.dtype == np.int32 and batch.shape == (2, 4)
    assert batch[0].tolist() == [15496, 995, 11, 50256]
    assert batch[1].tolist() == [17250, 50256, 50256, 50256]


def test_tiktoken_tokenizer_saves_and_loads(gpt2_tokenizer, tmp_path):
    gpt2_tokenizer.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, TiktokenTokenizer) and again.encode("Hello") == [15496]
    assert (again.vocab_size, again.pad_id) == (50257, 50256)


def test_gpt2_checkpoints_get_tiktoken(gpt2_tokenizer, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 50257}')
    tok = pretrained_tokenizer(tmp_path)
    assert isinstance(tok, TiktokenTokenizer) and tok.vocab_size == 50257


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    folder = tmp_path_factory.mktemp("wordpiece")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return HFTokenizer(transformers.BertTokenizer(str(folder / "vocab.txt")))


@pytest.mark.hf
def test_wordpiece_tokenizer_behind_the_zoo_interface(bert_tokenizer):
    tok = bert_tokenizer
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (12, 0, 2, 3, 1)
    assert tok.encode("the cats sat") == [5, 6, 10, 7]
    assert tok.encode("the dog", add_bos=True, add_eos=True) == [2, 5, 1, 3]
    assert tok.decode([2, 5, 6, 10, 7, 3, 0]) == "the cats sat"
    assert "[CLS]" in tok.decode([2, 5, 3], skip_special=False)


@pytest.mark.hf
def test_wordpiece_batches_are_padded_and_truncated(bert_tokenizer):
    batch = bert_tokenizer.encode_batch(
        ["the cat sat on the mat", "a cat"], length=6, add_bos=True, add_eos=True
    )
    assert batch.dtype == np.int32
    assert batch.tolist() == [[2, 5, 6, 7, 8, 3], [2, 11, 6, 3, 0, 0]]


@pytest.mark.hf
def test_wrapped_tokenizer_saves_and_loads_with_its_checkpoint(bert_tokenizer, tmp_path):
    random_checkpoint(tmp_path, {**CONFIGS["bert"], "vocab_size": 12})
    bert_tokenizer.save(tmp_path)
    model, tok = from_pretrained(tmp_path, return_tokenizer=True)
    assert isinstance(tok, HFTokenizer) and model.config.vocab_size == tok.vocab_size
    assert tok.encode("a mat", add_bos=True) == [2, 11, 9]
