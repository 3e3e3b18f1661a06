"""`from_hf` on small in-memory datasets: shapes, padding, labels, splits, for each task."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

from zoo.data import (
    ArrayBatches,
    CharTokenizer,
    PairTokenizer,
    RandomBlocks,
    WordTokenizer,
    from_hf,
    unpack_blocks,
)
from zoo.data.options import DataConfig, DataKeywords

REVIEWS = [
    ("great", 1),
    ("awful film", 0),
    ("a fine and warm story", 1),
    ("bad", 0),
    ("loved every minute of it", 1),
    ("boring", 0),
    ("tedious and long, far too long for its own good", 0),
    ("superb", 1),
]


def reviews(rows=REVIEWS):
    return Dataset.from_dict({"text": [t for t, _ in rows], "label": [y for _, y in rows]})


def all_batches(source):
    return [source.batch(step) for step in range(len(source))]


def test_classification_shapes_padding_and_labels():
    data = from_hf(
        DatasetDict({"train": reviews(), "validation": reviews(REVIEWS[:3])}),
        task="classification",
        tokenizer="char",
        batch_size=2,
        max_len=32,
        buckets=[8, 16],
    )
    tok = data.tokenizer
    assert isinstance(tok, CharTokenizer) and data.num_classes == 2
    assert len(data.train) == 4 and len(data.validation) == 2  # 8 // 2, ceil(3 / 2)
    label_of = dict(REVIEWS)
    seen = []
    for batch in all_batches(data.train):
        tokens, labels = batch["tokens"], batch["labels"]
        assert tokens.dtype == labels.dtype == np.int32
        assert tokens.shape[0] == 2 and tokens.shape[1] in (8, 16, 32)
        assert (tokens[:, 0] == tok.bos_id).all()  # the first token is the one pooled
        for row, label in zip(tokens, labels):
            text = tok.decode(row)
            real = int(np.count_nonzero(row != tok.pad_id))
            assert real == len(text) + 1  # bos + one id per character
            assert (row[real:] == tok.pad_id).all()
            # 48 characters + bos do not fit max_len 32: cut to the first 31 characters.
            full = next(t for t in label_of if t[:31] == text)
            assert label == label_of[full]
            seen.append(full)
    assert sorted(seen) == sorted(label_of)  # one epoch sees every example once
    first = data.validation.batch(0)
    assert [tok.decode(r) for r in first["tokens"]] == ["great", "awful film"]
    assert first["labels"].tolist() == [1, 0]


def test_classification_num_classes_from_class_label():
    features = Features({"text": Value("string"), "label": ClassLabel(names=["a", "b", "c"])})
    train = Dataset.from_dict({"text": ["x", "y", "z", "w"], "label": [0, 1, 0, 1]}, features)
    data = from_hf(train, task="classification", tokenizer="char", batch_size=2)
    assert data.num_classes == 3  # declared, although class 2 never occurs


def test_language_modeling_packs_documents():
    train = Dataset.from_dict({"text": ["abc", "de"]})
    valid = Dataset.from_dict({"text": ["abcde"]})
    data = from_hf(
        DatasetDict({"train": train, "validation": valid}),
        task="language_modeling",
        tokenizer="char",
        max_len=2,
        batch_size=3,
        seed=1,
    )
    tok = data.tokenizer
    a, b, c, d, e = tok.encode("abcde")
    eos, pad = tok.eos_id, tok.pad_id
    (batch,) = all_batches(data.train)
    # stream a b c eos d e eos -> blocks of 3 sharing one token: abc, c eos d, d e eos
    assert sorted(map(tuple, batch["tokens"].tolist())) == sorted(
        [(a, b, c), (c, eos, d), (d, e, eos)]
    )
    (valid_batch,) = all_batches(data.validation)
    np.testing.assert_array_equal(valid_batch["tokens"], [[a, b, c], [c, d, e], [e, eos, pad]])


def test_language_modeling_unpacked_rows():
    train = Dataset.from_dict({"text": ["ab", "abcdef", "b", "ba"]})
    data = from_hf(
        train, task="lm", tokenizer="char", packing=False, max_len=4, batch_size=1, buckets=[2, 4]
    )
    tok = data.tokenizer
    rows = [data.train.batch(s)["tokens"][0] for s in range(len(data.train))]
    rows += [data.validation.batch(0)["tokens"][0]]
    # bos + text + eos padded to a bucket length + 1: "b" -> 3; "ab", "ba", "abcdef" -> 5
    assert sorted(len(r) for r in rows) == [3, 5, 5, 5]
    by_text = {tok.decode(r): r for r in rows}
    assert set(by_text) == {"ab", "abc", "b", "ba"}  # "abcdef" cut to 5 tokens, eos kept
    np.testing.assert_array_equal(by_text["abc"], [1, *tok.encode("abc"), tok.eos_id])
    np.testing.assert_array_equal(by_text["b"], [1, *tok.encode("b"), tok.eos_id])
    np.testing.assert_array_equal(by_text["ba"], [1, *tok.encode("ba"), tok.eos_id, 0])


def test_translation_src_and_tgt():
    pairs = {
        "de": ["ein hund .", "zwei katzen schlafen .", "ein mann", "eine frau lacht ."],
        "en": ["a dog .", "two cats sleep .", "a man", "a woman laughs ."],
    }
    data = from_hf(
        DatasetDict({"train": Dataset.from_dict(pairs), "validation": Dataset.from_dict(pairs)}),
        task="translation",
        tokenizer="word",
        batch_size=1,
        buckets=[8],
        max_len=16,
    )
    tok = data.tokenizer
    assert isinstance(tok, PairTokenizer)
    assert isinstance(tok.source, WordTokenizer) and "hund" in tok.source.words
    assert "hund" not in tok.target.words and "dog" not in tok.source.words
    assert len(data.train) == len(data.validation) == 4
    for step, (german, english) in enumerate(zip(pairs["de"], pairs["en"])):
        batch = data.validation.batch(step)  # validation keeps the dataset's order
        src, tgt = batch["src"][0], batch["tgt"][0]
        assert src.shape == tgt.shape == (8,)
        n, m = len(german.split()), len(english.split())
        np.testing.assert_array_equal(src[: n + 1], [*tok.source.encode(german), tok.eos_id])
        np.testing.assert_array_equal(
            tgt[: m + 2], [tok.bos_id, *tok.target.encode(english), tok.eos_id]
        )
        assert (src[n + 1 :] == 0).all() and (tgt[m + 2 :] == 0).all()
        assert tok.source.decode(src) == german.replace(" .", ".")


def test_translation_shared_tokenizer_and_columns():
    pairs = {"en": ["a dog", "the cat"], "fr": ["un chien", "le chat"]}
    data = from_hf(
        DatasetDict({"train": Dataset.from_dict(pairs), "test": Dataset.from_dict(pairs)}),
        task="translation",
        tokenizer="word",
        source_column="en",
        target_column="fr",
        share_tokenizer=True,
        validation_split="test",
        batch_size=2,
    )
    assert isinstance(data.tokenizer, WordTokenizer)
    assert {"dog", "chien"} <= set(data.tokenizer.words)
    batch = data.validation.batch(0)
    assert [data.tokenizer.decode(r) for r in batch["tgt"]] == ["un chien", "le chat"]


def test_holdout_is_seeded_and_disjoint():
    train = Dataset.from_dict(
        {"text": [f"t{i}" for i in range(20)], "label": [i % 2 for i in range(20)]}
    )

    def split_texts(seed):
        data = from_hf(train, task="classification", tokenizer="char", batch_size=2, seed=seed)
        tok = data.tokenizer
        texts = lambda source: {tok.decode(r) for b in all_batches(source) for r in b["tokens"]}  # noqa: E731
        return texts(data.train), texts(data.validation)

    fit, held = split_texts(0)
    assert len(held) == 2 and len(fit) == 18 and not fit & held
    assert split_texts(0) == (fit, held)
    assert split_texts(1)[1] != held


def test_language_modeling_holdout_by_position():
    text = "abcdefghiabcdefghiab"  # 20 characters: 18 train, 2 validate
    data = from_hf(
        Dataset.from_dict({"text": [text]}), task="lm", tokenizer="char", max_len=4, batch_size=1
    )
    tok = data.tokenizer
    blocks = np.concatenate([b["tokens"] for b in all_batches(data.validation)])
    assert tok.decode(unpack_blocks(blocks, 3), skip_special=False) == "ab<eos>"
    train_blocks = data.train.arrays["tokens"]
    assert tok.decode(unpack_blocks(train_blocks, 19)) == text[:18]


def test_unpacking_gives_three_sources():
    train, validation, tokenizer = from_hf(
        reviews(), task="classification", tokenizer="char", batch_size=2
    )
    assert len(train) == 3 and len(validation) == 1
    assert tokenizer.vocab_size > 4


def test_language_modeling_random_blocks():
    text = "abcdefghij" * 20
    data = from_hf(
        Dataset.from_dict({"text": [text]}),
        task="lm",
        tokenizer="char",
        max_len=8,
        batch_size=4,
        random_blocks=True,
    )
    assert isinstance(data.train, RandomBlocks)
    assert len(data.train) == (180 + 1 - 1) // (8 * 4)  # 180 train characters + eos
    tokens = data.train.batch(2)["tokens"]
    assert tokens.shape == (4, 9)
    for row in tokens:
        assert data.tokenizer.decode(row, skip_special=False) in text + "<eos>"
    assert isinstance(data.validation, ArrayBatches)  # validation stays in order


def test_data_keywords_are_the_fields_of_data_config():
    """`from_hf(**options)` is typed by `DataKeywords`: it names every field but the task."""
    assert list(DataKeywords.__annotations__) == [f.name for f in fields(DataConfig)][1:]
