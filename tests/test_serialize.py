"""A saved model folder: damaged files are named, and a tokenizer from elsewhere is refused."""

from __future__ import annotations

import shutil
import string

import jax
import pytest

import zoo
from zoo.data import CharTokenizer, WordTokenizer
from zoo.serialize import load_with_tokenizer

TOKENIZER = CharTokenizer(string.ascii_lowercase + " ")
QUERY = "encoder.blocks.self_attention.query_proj"  # a Linear of the classifier


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = zoo.create("classifier-tiny", key=jax.random.key(0), vocab_size=TOKENIZER.vocab_size)
    directory = tmp_path_factory.mktemp("saved")
    zoo.save(model, directory, tokenizer=TOKENIZER)
    return directory


def damaged_copy(saved, tmp_path, name, cut):
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    data = (copy / name).read_bytes()
    (copy / name).write_bytes(data[: cut(len(data))])
    return copy


@pytest.mark.parametrize(
    "name, cut, message",
    [
        # before: SafetensorError: Error while deserializing header: ...
        (
            "model.safetensors",
            lambda n: n // 2,
            "model.safetensors is damaged .*not a complete safetensors file; save the model again",
        ),
        ("model.safetensors", lambda n: 0, "model.safetensors is damaged"),
        # before: the bare JSON parser message, naming no file
        (
            "config.json",
            lambda n: n // 2,
            r"config.json is damaged \(not valid JSON: .*\); save "
            r"the model again \(zoo.save\), or for a `zoo train` run rebuild the folder with "
            r"`zoo train ... --resume`",
        ),
        ("config.json", lambda n: 0, r"config.json is damaged \(not valid JSON"),
        ("zoo_tokenizer.json", lambda n: n - 5, r"zoo_tokenizer.json is damaged \(not valid JSON"),
    ],
)
def test_a_damaged_file_is_named(saved, tmp_path, name, cut, message):
    copy = damaged_copy(saved, tmp_path, name, cut)
    with pytest.raises(ValueError, match=message):
        load_with_tokenizer(copy)


def test_a_tokenizer_from_another_corpus_is_refused(saved, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    WordTokenizer.from_corpus(["some other corpus words"]).save(copy)  # 8 tokens, the model 31
    with pytest.raises(ValueError, match=r"zoo_tokenizer.json has 8 tokens, but the model was "
                       r"saved with a char tokenizer of 31: it belongs to another corpus"):  # fmt: skip
        load_with_tokenizer(copy)
    model, tokenizer = load_with_tokenizer(saved)
    assert tokenizer.vocab_size == model.config.vocab_size == 31


def test_a_folder_without_the_record_still_refuses_a_larger_tokenizer(saved, tmp_path):
    import json

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    meta = json.loads((copy / "config.json").read_text())
    del meta["tokenizer"]  # as written before the sizes were recorded
    (copy / "config.json").write_text(json.dumps(meta))
    CharTokenizer(string.ascii_letters + " ").save(copy)  # 57 tokens for a 31-token model
    with pytest.raises(ValueError, match="has 57 tokens but the model's vocabulary only 31"):
        load_with_tokenizer(copy)


@pytest.mark.parametrize(
    "entry, message",
    [
        # before: TypeError: string indices must be integers, naming no file
        ({"lora": {QUERY: "rank 4"}}, rf"the adapter at '{QUERY}' has no whole rank"),
        # before: the saved adapters sit on Linear layers this model lacks: [4]
        ({"lora": [4]}, r'"lora" is a list, not an object'),
        # before: no float Linear layer ... at ['a', 'd', 'e', 'h'] to quantize (its letters)
        ({"quantized": {"mode": "int8", "paths": "head"}}, r'"quantized" has no list of layer'),
    ],
)
def test_a_garbled_adapter_or_int8_record_is_named(saved, tmp_path, entry, message):
    import json

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    meta = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**meta, **entry}))
    with pytest.raises(ValueError, match=rf"config.json is damaged \({message}"):
        zoo.load(copy)
