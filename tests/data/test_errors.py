"""Each kind of bad input gets an error that names the problem and the fix."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset, DatasetDict

from zoo.data import DataConfig, DataError, from_hf


def reviews(texts=("good", "bad", "fine", "dull"), labels=(1, 0, 1, 0)):
    return Dataset.from_dict({"text": list(texts), "label": list(labels)})


def test_missing_column_lists_the_real_ones():
    with pytest.raises(DataError, match=r"'review'.*\['text', 'label'\].*text_column="):
        from_hf(reviews(), task="classification", tokenizer="char", text_column="review")
    pairs = Dataset.from_dict({"en": ["a"], "fr": ["un"]})
    with pytest.raises(DataError, match=r"column 'de'.*\['en', 'fr'\].*source_column="):
        from_hf(pairs, task="translation", tokenizer="char")


def test_labels_outside_num_classes_are_named():
    data = reviews(labels=(0, 1, 4, 2))
    with pytest.raises(DataError, match=r"2 labels.*num_classes=2\): \[2, 4\]; set num_classes=5"):
        from_hf(
            DatasetDict({"train": data, "validation": data}),
            task="classification",
            tokenizer="char",
            num_classes=2,
        )
    negative = DatasetDict({"train": reviews(), "validation": reviews(labels=(0, -1, 1, -1))})
    with pytest.raises(DataError, match=r"'validation' split.*\[-1\]; drop them"):
        from_hf(negative, task="classification", tokenizer="char", batch_size=2)


def test_string_labels_suggest_class_encoding():
    data = reviews(labels=("pos", "neg", "pos", "neg"))
    with pytest.raises(DataError, match=r"class_encode_column\('label'\)"):
        from_hf(data, task="classification", tokenizer="char")


def test_empty_split_is_named():
    empty = DatasetDict({"train": reviews(), "validation": reviews((), ())})
    with pytest.raises(DataError, match="'validation' split is empty"):
        from_hf(empty, task="classification", tokenizer="char", batch_size=2)
    with pytest.raises(DataError, match="'train' split is empty"):
        from_hf(DatasetDict({"train": reviews((), ())}), task="classification", tokenizer="char")


def test_missing_split_lists_the_real_ones():
    data = DatasetDict({"train": reviews(), "test": reviews()})
    with pytest.raises(DataError, match=r"no 'dev' split.*\['train', 'test'\]"):
        from_hf(data, task="classification", tokenizer="char", validation_split="dev")
    with pytest.raises(DataError, match=r"no 'training' split.*train_split="):
        from_hf(data, task="classification", tokenizer="char", train_split="training")


def test_long_text_is_truncated_and_counted(caplog):
    texts = ("a" * 40, "b" * 3, "c" * 50, "d")
    with caplog.at_level(logging.WARNING, logger="zoo.data"):
        data = from_hf(
            DatasetDict({"train": reviews(texts), "validation": reviews(texts)}),
            task="classification",
            tokenizer="char",
            max_len=16,
            batch_size=2,
        )
    assert "truncated 2 of 4 examples in the 'train' split" in caplog.text
    assert max(data.train.batch(s)["tokens"].shape[1] for s in range(2)) == 16


def test_long_text_refused_without_truncation():
    texts = ("a" * 40, "b" * 3, "c" * 50, "d")
    with pytest.raises(DataError, match=r"2 of 4 examples.*longer.*raise max_len"):
        from_hf(
            DatasetDict({"train": reviews(texts), "validation": reviews(texts)}),
            task="classification",
            tokenizer="char",
            max_len=16,
            truncate=False,
        )


def test_missing_text_value_is_reported():
    data = Dataset.from_dict({"text": ["ok", None, "fine"], "label": [0, 1, 0]})
    with pytest.raises(DataError, match=r"column 'text' holds a NoneType"):
        from_hf(data, task="classification", tokenizer="char")


def test_bad_options_are_named():
    with pytest.raises(TypeError, match=r"\['batchsize'\].*batch_size"):
        from_hf(reviews(), task="classification", batchsize=2)
    with pytest.raises(ValueError, match=r"unknown task 'regression'.*classification"):
        from_hf(reviews(), task="regression")
    with pytest.raises(ValueError, match="holdout"):
        DataConfig(task="lm", holdout=1.5)
    with pytest.raises(ValueError, match="validating on the training examples"):
        DataConfig(task="lm", validation_split="train")
    with pytest.raises(ValueError, match="exceeds max_len=32"):
        DataConfig(task="classification", max_len=32, buckets=[16, 64])


def test_too_few_examples_for_a_batch():
    with pytest.raises(ValueError, match="only 3 examples for batch_size=32"):
        from_hf(reviews(), task="classification", tokenizer="char")


def test_a_stray_label_does_not_add_classes_silently():
    # one 7 among 0/1 made an 8-class model whose classes 2..6 never train
    data = DatasetDict({"train": reviews(labels=(0, 1, 7, 0)), "validation": reviews()})
    with pytest.raises(DataError, match=r"column 'label' of the 'train' split are \{0: 2, 1: 1, "
                       r"7: 1\}: classes \[2, 3, 4, 5, 6\] have no example, so the model would "
                       r"get 8 outputs.*num_classes=8 \(zoo train --num-classes 8\)"):  # fmt: skip
        from_hf(data, task="classification", tokenizer="char", batch_size=2)
    stated = from_hf(data, task="classification", tokenizer="char", batch_size=2, num_classes=8)
    assert stated.num_classes == 8


def test_one_class_is_warned_about_with_its_count(caplog):
    data = DatasetDict({"train": reviews(labels=(1, 1, 1, 1)), "validation": reviews()})
    with caplog.at_level(logging.WARNING, logger="zoo.data"):
        loaded = from_hf(data, task="classification", tokenizer="char", batch_size=2)
    assert loaded.num_classes == 2
    assert "the 'train' split has one class (label counts {1: 4})" in caplog.text
    assert "zoo train --num-classes N" in caplog.text


def test_a_translator_needs_two_columns():
    pairs = Dataset.from_dict({"de": ["ein hund", "eine katze"], "en": ["a dog", "a cat"]})
    with pytest.raises(ValueError, match="source_column and target_column are both 'de': the "
                       "model would learn to copy its input"):  # fmt: skip
        from_hf(pairs, task="translation", tokenizer="char", target_column="de")


def test_split_batches_evaluates_one_split_without_a_train_split():
    from zoo.data import CharTokenizer
    from zoo.data.hf import split_batches

    tokenizer = CharTokenizer("abdefgilnou")
    test = reviews(labels=(1, 0, 1, 0))
    source = split_batches(test, task="classification", tokenizer=tokenizer, batch_size=3,
                           num_classes=2, split_name="test")  # fmt: skip
    batches = [source.batch(index) for index in range(len(source))]
    assert [b["labels"].tolist() for b in batches] == [[1, 0, 1], [0]]  # in order, none dropped
    assert batches[1]["tokens"][0, :5].tolist() == [1, *tokenizer.encode("dull")]
