"""Streaming sources: sequential reads, resume by re-reading, reshuffled passes, packing."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, Features, IterableDataset, Value

from zoo.data import CharTokenizer, DataError, StreamingBatches, from_hf, pack_blocks

FEATURES = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
TEXTS = [f"review number {i} " + "x" * (i % 7) for i in range(40)]


def reviews_stream(num=40) -> IterableDataset:
    rows = {"text": TEXTS[:num], "label": [i % 2 for i in range(num)]}
    return Dataset.from_dict(rows, features=FEATURES).to_iterable_dataset()


def tokens_of(batch):
    return batch["tokens"].tolist()


def test_stream_batches_resume_and_reshuffle():
    data = from_hf(
        {"train": reviews_stream()},
        task="classification",
        tokenizer="char",
        batch_size=6,
        shuffle_buffer=16,
        seed=2,
    )
    assert data.validation is None and data.num_classes == 2
    source = data.train
    assert isinstance(source, StreamingBatches)
    assert len(source) == 40 // 6  # counted by reading the stream once
    in_order = [tokens_of(source.batch(step)) for step in range(14)]  # two passes and more
    fresh = from_hf(
        reviews_stream(),
        task="classification",
        tokenizer=data.tokenizer,
        batch_size=6,
        shuffle_buffer=16,
        seed=2,
    )
    assert tokens_of(fresh.train.batch(9)) == in_order[9]  # resumed mid-pass: re-read to it
    assert tokens_of(fresh.train.batch(3)) == in_order[3]  # and back
    assert in_order[:6] != in_order[6:12]  # pass 1 is reshuffled
    texts = [data.tokenizer.decode(row) for batch in in_order[:6] for row in batch]
    assert len(set(texts)) == 36 and set(texts) <= set(TEXTS)
    for batch in (source.batch(2), source.batch(8)):
        assert batch["tokens"].shape[0] == 6 and batch["tokens"].shape[1] in (16, 32, 64, 128)
        assert batch["labels"].dtype == np.int32


def test_stream_labels_follow_their_text():
    tokenizer = CharTokenizer.from_corpus(TEXTS)
    data = from_hf(reviews_stream(), task="classification", tokenizer=tokenizer, batch_size=4)
    label_of = {text: i % 2 for i, text in enumerate(TEXTS)}
    batch = data.train.batch(3)
    for row, label in zip(batch["tokens"], batch["labels"]):
        assert label_of[tokenizer.decode(row)] == label


def test_streamed_language_modeling_packs_like_memory():
    docs = ["abc", "defgh", "ij", "klmnopq"]
    tokenizer = CharTokenizer.from_corpus(docs)
    data = from_hf(
        Dataset.from_dict({"text": docs}),
        task="lm",
        tokenizer=tokenizer,
        streaming=True,
        max_len=3,
        batch_size=2,
        shuffle_buffer=0,
    )
    stream = [i for doc in docs for i in tokenizer.encode(doc, add_eos=True)]  # 21 tokens
    blocks = pack_blocks(np.array(stream), 3, tokenizer.pad_id)  # 7 blocks, 3 full batches
    assert len(data.train) == 3
    got = np.concatenate([data.train.batch(step)["tokens"] for step in range(3)])
    np.testing.assert_array_equal(got, blocks[:6])
    np.testing.assert_array_equal(data.train.batch(3)["tokens"], blocks[:2])  # pass 1 begins


def test_stream_validation_keeps_last_batch_and_steps_per_epoch():
    splits = {"train": reviews_stream(), "validation": reviews_stream(10)}
    data = from_hf(
        splits,
        task="classification",
        tokenizer="char",
        batch_size=4,
        steps_per_epoch=100,
    )
    assert len(data.train) == 100
    assert len(data.validation) == 3  # 4 + 4 + 2
    assert data.validation.batch(2)["tokens"].shape[0] == 2


def test_stream_needs_num_classes_without_class_label():
    plain = Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}).to_iterable_dataset()
    with pytest.raises(DataError, match="num_classes is needed"):
        from_hf(plain, task="classification", tokenizer="char")
    data = from_hf(plain, task="classification", tokenizer="char", num_classes=2, batch_size=2)
    assert data.train.batch(0)["labels"].tolist() in ([0, 1], [1, 0])


def test_stream_bad_label_is_reported_when_read():
    plain = Dataset.from_dict({"text": ["a", "b"], "label": [0, 7]}).to_iterable_dataset()
    data = from_hf(plain, task="classification", tokenizer="char", num_classes=2, batch_size=2)
    with pytest.raises(DataError, match=r"\[7\]; set num_classes=8"):
        data.train.batch(0)


def test_empty_stream_says_so():
    empty = Dataset.from_dict({"text": ["a"], "label": [0]}, features=FEATURES)
    data = from_hf(
        empty.to_iterable_dataset(), task="classification", tokenizer="char", batch_size=4
    )
    with pytest.raises(DataError, match="no full batch"):
        len(data.train)


def test_stream_long_text_truncated_or_refused(caplog):
    rows = Dataset.from_dict(
        {"text": ["x" * 50, "ab", "cd", "ef"], "label": [0, 1, 0, 1]}, features=FEATURES
    )
    data = from_hf(
        rows.to_iterable_dataset(),
        task="classification",
        tokenizer="char",
        max_len=16,
        batch_size=2,
        shuffle_buffer=0,
    )
    assert data.train.batch(0)["tokens"].shape == (2, 16)
    len(data.train)  # reads the whole pass
    assert "truncated 1 of 4 examples in the 'train' stream" in caplog.text
    strict = from_hf(
        rows.to_iterable_dataset(),
        task="classification",
        tokenizer="char",
        max_len=16,
        batch_size=2,
        truncate=False,
    )
    with pytest.raises(DataError, match="longer than the model takes"):
        strict.train.batch(0)
