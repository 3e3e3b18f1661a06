"""`FastTokenizer`: Llama 3, Qwen2.5 and Mistral tokenizers read from `tokenizer.json`.

The folders are laid out like the hub snapshots (fast_tokenizer_folders.py); the reference is
`transformers.AutoTokenizer` reading the same folder.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fast_tokenizer_folders import (
    FOLDERS,
    READ_AS_IS,
    SAMPLE,
    llama3_folder,
    mistral_folder,
    qwen_folder,
)

import zoo
from zoo.data import load_tokenizer
from zoo.interop import FastTokenizer, HFTokenizer, pretrained_tokenizer

CHAT = "<|im_start|>user\nWie geht's? 你好<|im_end|>\n<|im_start|>assistant\n"
FAMILIES = list(FOLDERS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("snapshots")
    return {name: build(root / name) for name, build in FOLDERS.items()}


@pytest.fixture(scope="module")
def auto(folders):
    """transformers' tokenizer of each folder: AutoTokenizer, or the file as it is where
    transformers 5's AutoTokenizer rebuilds the pipeline differently (READ_AS_IS)."""
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    return {
        name: (
            transformers.PreTrainedTokenizerFast
            if name in READ_AS_IS
            else transformers.AutoTokenizer
        ).from_pretrained(str(folder))
        for name, folder in folders.items()
    }


@pytest.mark.hf
@pytest.mark.parametrize("family", FAMILIES)
def test_ids_equal_auto_tokenizer_on_multilingual_text(folders, auto, family):
    tok, reference = pretrained_tokenizer(folders[family]), auto[family]
    assert isinstance(tok, FastTokenizer)
    for text in [*SAMPLE, CHAT]:
        expected = reference(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == expected, text
        assert tok.encode_many([text, text]) == [expected, expected]
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (
        reference.bos_token_id,
        reference.eos_token_id,
        reference.unk_token_id,
    )


@pytest.mark.hf
@pytest.mark.parametrize("family", FAMILIES)
def test_add_bos_adds_what_auto_tokenizer_adds(folders, auto, family):
    tok, reference = pretrained_tokenizer(folders[family]), auto[family]
    text = SAMPLE[1]
    with_specials = reference(text)["input_ids"]
    assert tok.adds_bos == (with_specials != reference(text, add_special_tokens=False)["input_ids"])
    if tok.adds_bos:  # Llama 3 (post-processor), Mistral (add_bos_token)
        assert tok.encode(text, add_bos=True) == with_specials
        assert with_specials[0] == tok.bos_id
    if tok.bos_id is None:  # Qwen has no bos token: asking for one says so
        with pytest.raises(ValueError, match="no bos_id"):
            tok.encode(text, add_bos=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_round_trips_and_drops_special_tokens(folders, family):
    tok = pretrained_tokenizer(folders[family])
    for text in SAMPLE:
        ids = tok.encode(text, add_bos=tok.bos_id is not None, add_eos=True)
        assert tok.decode(ids) == text
        assert tok.decode(np.asarray(ids[:-1] + [tok.pad_id] * 3)) == text  # padded rows


@pytest.mark.hf
def test_decode_matches_auto_tokenizer_with_and_without_specials(folders, auto):
    tok, reference = pretrained_tokenizer(folders["qwen2"]), auto["qwen2"]
    ids = tok.encode("<|im_start|>user\nGrüße 🎉")  # no eos inside: decode runs to the end
    assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=True) == "user\nGrüße 🎉"
    assert (
        tok.decode(ids, skip_special=False) == reference.decode(ids) == "<|im_start|>user\nGrüße 🎉"
    )


def test_llama3_stops_on_every_eos_of_the_generation_config(folders):
    tok = pretrained_tokenizer(folders["llama3"])
    generation = json.loads((folders["llama3"] / "generation_config.json").read_text())
    end, eom, eot = (
        tok.tokenizer.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
    )
    assert generation["eos_token_id"] == [end, eom, eot]
    # the tokenizer's own eos comes first, then the generation config's others in order
    assert tok.eos_ids == (eot, end, eom) and tok.eos_id == eot
    assert tok.encode("hi", add_eos=True)[-1] == eot
    hello = tok.encode("Hello")
    for stop in (end, eom, eot):
        assert tok.decode([tok.bos_id, *hello, stop, *tok.encode(" more")]) == "Hello"
    # no pad token: pad with eos (mask padding by length)
    assert tok.pad_token_id is None and tok.pad_id == eot
    batch = tok.encode_batch(["Hello", SAMPLE[0]], length=6, add_bos=True)
    assert batch[0].tolist() == [tok.bos_id, *hello, *[eot] * (5 - len(hello))]


def test_qwen_special_ids_come_from_its_tokenizer_config(folders):
    tok = pretrained_tokenizer(folders["qwen2"])
    end, im_start, im_end = (
        tok.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    )
    # "bos_token": null wins over config.json's bos_token_id; eos list = generation config's
    assert (tok.bos_id, tok.eos_ids, tok.pad_id, tok.unk_id, tok.adds_bos) == (
        None,
        (im_end, end),
        end,
        None,
        False,
    )
    assert tok.special_ids == {end, im_start, im_end}
    assert tok.vocab_size == tok.tokenizer.get_vocab_size() == 403  # 400 BPE + 3 specials


def test_smollm2_specials_lead_the_vocabulary_and_digits_split(folders):
    tok = pretrained_tokenizer(folders["smollm2"])
    assert (tok.unk_id, tok.bos_id, tok.eos_ids, tok.pad_id, tok.adds_bos) == (0, 1, (2,), 2, False)
    ids = tok.encode("in 2024")
    assert [tok.tokenizer.id_to_token(i) for i in ids[-4:]] == ["2", "0", "2", "4"]
    assert tok.decode([1, *ids, 2, 0]) == "in 2024"


def test_mistral_has_unk_and_byte_fallback(folders):
    tok = pretrained_tokenizer(folders["mistral"])
    assert (tok.unk_id, tok.bos_id, tok.eos_ids, tok.pad_id, tok.adds_bos) == (0, 1, (2,), 2, True)
    ids = tok.encode("我")  # not among the merges: three UTF-8 bytes, each a <0xNN> token
    pieces = [tok.tokenizer.id_to_token(i) for i in ids]
    assert pieces[-3:] == ["<0xE6>", "<0x88>", "<0x91>"]
    assert tok.decode(ids) == "我"


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_tokenizer_loads_back_identical(folders, tmp_path, family):
    tok = pretrained_tokenizer(folders[family])
    tok.save(tmp_path)
    template = ["chat_template.jinja"] if tok.chat_template is not None else []  # as transformers
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        *template,
        "tokenizer.json",
        "tokenizer_config.json",
        "zoo_tokenizer.json",
    ]
    again = load_tokenizer(tmp_path)
    assert isinstance(again, FastTokenizer) and again.state() == tok.state()
    assert again.tokenizer.to_str() == tok.tokenizer.to_str()
    assert again.tokenizer_config == tok.tokenizer_config
    assert (again.vocab_size, again.pad_id, again.special_ids) == (
        tok.vocab_size,
        tok.pad_id,
        tok.special_ids,
    )
    assert [again.encode(t) for t in SAMPLE] == [tok.encode(t) for t in SAMPLE]
    assert pretrained_tokenizer(tmp_path).state() == tok.state()  # zoo_tokenizer.json wins


@pytest.mark.hf
def test_transformers_reads_the_saved_folder(folders, auto, tmp_path):
    transformers = pytest.importorskip("transformers")
    pretrained_tokenizer(folders["llama3"]).save(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert [reference(t)["input_ids"] for t in SAMPLE] == [
        auto["llama3"](t)["input_ids"] for t in SAMPLE
    ]
    assert reference.eos_token == "<|eot_id|>"


@pytest.mark.slow
def test_saved_tokenizer_loads_in_a_fresh_process(folders, tmp_path):
    """load_tokenizer finds the kind without zoo.interop having been imported first."""
    pretrained_tokenizer(folders["llama3"]).save(tmp_path)
    code = f"from zoo.data import load_tokenizer; print(load_tokenizer({str(tmp_path)!r}).eos_ids)"
    root = str(Path(zoo.__file__).parents[1])  # this checkout's zoo, wherever pytest runs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(pretrained_tokenizer(folders["llama3"]).eos_ids)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_pretrained_tokenizer_picks_tokenizer_json_for_these_families(tmp_path, model_type):
    qwen_folder(tmp_path, model_type=model_type)
    assert isinstance(pretrained_tokenizer(tmp_path), FastTokenizer)


@pytest.mark.hf
def test_bert_keeps_the_transformers_tokenizer_even_with_tokenizer_json(tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat"])
    )
    transformers.BertTokenizerFast(str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert (tmp_path / "tokenizer.json").is_file()
    tok = pretrained_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.encode("cat", add_bos=True, add_eos=True) == [
        2,
        5,
        3,
    ]


def test_folder_without_tokenizer_json_says_what_to_download(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(
        FileNotFoundError, match=r"has no tokenizer\.json: download it .*huggingface-cli download"
    ):
        pretrained_tokenizer(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"sentencepiece")
    with pytest.raises(
        FileNotFoundError, match=r"write it from tokenizer\.model .*save_pretrained"
    ):
        FastTokenizer.from_folder(tmp_path)


def test_damaged_tokenizer_json_is_named(tmp_path):
    llama3_folder(tmp_path)
    path = tmp_path / "tokenizer.json"
    path.write_text(path.read_text()[:500])  # a download cut short
    with pytest.raises(
        ValueError, match=rf"{path} is damaged: the tokenizers library cannot read it"
    ):
        pretrained_tokenizer(tmp_path)


def test_damaged_tokenizer_config_is_named(tmp_path):
    llama3_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": ')
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is damaged \(not valid JSON"):
        pretrained_tokenizer(tmp_path)


def test_bos_token_outside_the_vocabulary_is_refused(tmp_path):
    mistral_folder(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "bos_token": {"content": "<|nope|>"}}))
    with pytest.raises(
        ValueError, match=r"the bos token '<\|nope\|>' named in tokenizer_config\.json"
    ):
        pretrained_tokenizer(tmp_path)


def test_odd_special_tokens_are_refused_or_explained(tmp_path):
    mistral_folder(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "eos_token": 2}))
    with pytest.raises(ValueError, match=r'eos_token should be a token string or \{"content"'):
        pretrained_tokenizer(tmp_path)
    config_path.write_text(json.dumps({**config, "eos_token": None}))
    for name in ("generation_config.json", "config.json", "special_tokens_map.json"):
        (tmp_path / name).write_text('{"model_type": "mistral"}')
    tok = pretrained_tokenizer(tmp_path)
    assert (tok.eos_id, tok.eos_ids) == (None, ())
    with pytest.raises(ValueError, match=r'neither a pad token nor an eos token.*"pad_token"'):
        tok.pad_id


def test_config_eos_ids_outside_the_vocabulary_are_left_out_with_a_warning(tmp_path, caplog):
    qwen_folder(tmp_path)
    generation_path = tmp_path / "generation_config.json"
    generation = json.loads(generation_path.read_text())
    generation_path.write_text(json.dumps({**generation, "eos_token_id": [151645, 400]}))
    with caplog.at_level(logging.WARNING, logger="zoo.interop"):
        tok = pretrained_tokenizer(tmp_path)
    assert tok.eos_ids == (402, 400)  # <|im_end|> (tokenizer_config), then <|endoftext|>
    assert "eos_token_id 151645 is outside the vocabulary [0, 403); left out" in caplog.text


@pytest.mark.parametrize(
    ("name", "value"), [("generation_config.json", "2"), ("config.json", [2, "</s>"])]
)
def test_config_eos_ids_that_are_no_ids_name_the_file(tmp_path, name, value):
    mistral_folder(tmp_path)
    path = tmp_path / name
    path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": value}))
    with pytest.raises(ValueError, match="eos_token_id is") as caught:
        pretrained_tokenizer(tmp_path)
    assert str(caught.value).startswith(f"{path} is damaged (eos_token_id is ")


def test_a_t5_decoder_start_that_is_no_id_names_the_config(tmp_path):
    mistral_folder(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "decoder_start_token_id": "0"}))
    with pytest.raises(ValueError, match=r"decoder_start_token_id is '0', not a token id"):
        pretrained_tokenizer(tmp_path)
    path.write_text(json.dumps({"model_type": "t5", "pad_token_id": [0]}))
    with pytest.raises(ValueError, match=rf"{path} is damaged \(pad_token_id is \[0\]"):
        pretrained_tokenizer(tmp_path)


@pytest.mark.parametrize(
    ("entry", "value"),
    [("bos_id", "1"), ("eos_ids", 2), ("eos_ids", [2, None]), ("adds_bos", 1), ("extra", 0)],
)
def test_a_saved_state_of_the_wrong_type_names_the_file(folders, tmp_path, entry, value):
    pretrained_tokenizer(folders["mistral"]).save(tmp_path)
    path = tmp_path / "zoo_tokenizer.json"
    saved = json.loads(path.read_text())
    saved["state"][entry] = value
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=rf"{entry}") as caught:
        load_tokenizer(tmp_path)
    assert str(caught.value).startswith(f"{path} is damaged (missing or wrong entry ")


def test_missing_tokenizers_library_names_the_extra(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(
        ImportError, match=r"tokenizers library: pip install 'jax-transformer-zoo\[hf\]'"
    ):
        FastTokenizer.from_folder(folders["llama3"])


def test_tokenizer_json_past_its_bounds_is_refused_in_one_line(tmp_path, monkeypatch):
    """A tokenizer.json larger than `MAX_TOKENIZER_JSON_BYTES` is refused before the library
    reads it; one nested deeper than the library's JSON reader allows (128 levels) is named as
    damaged, in one line, with no crash."""
    from zoo.files import TooLarge
    from zoo.interop.tokenizers import fast_tokenizer

    llama3_folder(tmp_path)
    path = tmp_path / "tokenizer.json"
    size = path.stat().st_size
    monkeypatch.setattr(fast_tokenizer, "MAX_TOKENIZER_JSON_BYTES", size - 1)
    with pytest.raises(TooLarge, match=rf"^{path} refused: it holds {size:,} bytes, more than"):
        pretrained_tokenizer(tmp_path)
    monkeypatch.setattr(fast_tokenizer, "MAX_TOKENIZER_JSON_BYTES", size)
    assert pretrained_tokenizer(tmp_path).encode("Hello") != []
    monkeypatch.undo()
    document = {**json.loads(path.read_text()), "normalizer": "DEEP"}
    deep = '{"type": "Sequence", "normalizers": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text(json.dumps(document).replace('"DEEP"', deep))
    with pytest.raises(
        ValueError, match=rf"^{path} is damaged: the tokenizers library cannot"
    ) as error:
        pretrained_tokenizer(tmp_path)
    assert "\n" not in str(error.value)
