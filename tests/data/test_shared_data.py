"""Real batches from the shared copies of rotten_tomatoes, multi30k and tiny_shakespeare."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoo.data import PairTokenizer, from_hf, load_spec, unpack_blocks

from .shared_paths import SHARED_DATA, needs_shared_data

pytestmark = needs_shared_data


def test_rotten_tomatoes_classification(tmp_path):
    data = from_hf(
        load_spec(f"json:{SHARED_DATA / 'rotten_tomatoes'}", cache_dir=tmp_path),
        task="classification",
        tokenizer="word",
        tokenizer_options={"min_freq": 2},
        max_len=64,
        batch_size=32,
    )
    assert data.num_classes == 2
    assert (len(data.train), len(data.validation)) == (8530 // 32, -(-1066 // 32))
    batch = data.train.batch(0)
    # buckets="auto": at most four lengths fitted to the reviews (multiples of 8), then max_len
    lengths = data.train.lengths
    assert len(lengths) <= 5 and lengths[-1] == 64
    assert all(length % 8 == 0 for length in lengths)
    assert batch["tokens"].shape[0] == 32 and batch["tokens"].shape[1] in lengths
    assert set(np.unique(batch["labels"])) <= {0, 1}
    labels = np.concatenate(
        [data.validation.batch(s)["labels"] for s in range(len(data.validation))]
    )
    rows = (SHARED_DATA / "rotten_tomatoes" / "validation.jsonl").read_text().splitlines()
    expected = [json.loads(row)["label"] for row in rows]
    assert sorted(labels.tolist()) == sorted(expected)  # every example once, by bucket


def test_multi30k_translation(tmp_path):
    data = from_hf(
        load_spec(f"json:{SHARED_DATA / 'multi30k'}", cache_dir=tmp_path),
        task="translation",
        tokenizer="word",
        tokenizer_options={"min_freq": 2, "lowercase": True},
        max_len=64,
        batch_size=64,
    )
    tok = data.tokenizer
    assert isinstance(tok, PairTokenizer)
    assert (len(data.train), len(data.validation)) == (29000 // 64, -(-1014 // 64))
    first = data.validation.batch(0)
    assert tok.source.decode(first["src"][0]).startswith("eine gruppe von männern lädt")
    assert tok.decode(first["tgt"][0]).startswith("a group of men are loading")
    assert (first["tgt"][:, 0] == tok.bos_id).all()


def test_tiny_shakespeare_characters_as_nanogpt(tmp_path):
    data = from_hf(
        load_spec(f"text:{SHARED_DATA / 'tiny_shakespeare' / 'input.txt'}", cache_dir=tmp_path),
        task="language_modeling",
        tokenizer="char",
        max_len=256,
        batch_size=16,
    )
    assert data.tokenizer.vocab_size == 65 + 4  # nanoGPT's 65 characters and 4 specials
    # 1,003,854 train characters + eos in blocks of 257 sharing a token: 3922 blocks
    assert len(data.train) == 3922 // 16
    assert data.train.batch(0)["tokens"].shape == (16, 257)
    blocks = data.validation.arrays["tokens"]
    text = data.tokenizer.decode(unpack_blocks(blocks, 111_540))
    assert len(text) == 111_540 and text.startswith(
        "?\n\nGREMIO:\nGood morrow, neighbour Baptista."
    )


def test_tiny_shakespeare_gpt2_tokens_as_nanogpt(tmp_path, gpt2):
    data = from_hf(
        load_spec(f"text:{SHARED_DATA / 'tiny_shakespeare'}", cache_dir=tmp_path),
        task="lm",
        tokenizer=gpt2,
        max_len=1024,
        batch_size=8,
    )

    def tokens(source):
        stream = unpack_blocks(source.arrays["tokens"], source.arrays["tokens"].size)
        return int(np.count_nonzero(stream != gpt2.pad_id))

    # nanoGPT's shakespeare/prepare.py: 301,966 train and 36,059 validation tokens (+ our eos)
    assert tokens(data.train) == 301_966 + 1
    assert tokens(data.validation) == 36_059 + 1
    with pytest.raises(AssertionError):
        assert data.train.batch(0)["tokens"].max() >= gpt2.vocab_size
