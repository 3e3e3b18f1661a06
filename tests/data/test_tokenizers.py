"""Tokenizers: ids by hand, round trips, special ids, padding, save/load of every kind."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from zoo.data import (
    CharTokenizer,
    PairTokenizer,
    TiktokenTokenizer,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
    source_tokenizer,
    target_tokenizer,
)
from zoo.data.tokenizers.word import WordOptions, join_words, split_words

CORPUS = ["the cat sat.", "the dog sat.", "a cat!"]


def test_char_ids_and_round_trip():
    tok = CharTokenizer.from_corpus(["hello"])
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 4 + 4  # e h l o
    assert tok.encode("hello") == [5, 4, 6, 6, 7]
    assert tok.encode("hex", add_bos=True, add_eos=True) == [1, 5, 4, 3, 2]
    assert tok.decode(tok.encode("hex")) == "he<unk>"
    text = "hole hell"
    wide = CharTokenizer.from_corpus([text])
    assert wide.decode(wide.encode(text, add_bos=True, add_eos=True)) == text


def test_word_vocabulary_by_frequency_then_alphabet():
    tok = WordTokenizer.from_corpus(CORPUS, min_freq=2)
    # "." "cat" "sat" "the" occur twice each; "a" "dog" "!" once.
    assert tok.words == [".", "cat", "sat", "the"]
    assert tok.encode("the cat sat.") == [7, 5, 6, 4]
    assert tok.encode("The cat sat.") == [3, 5, 6, 4]  # "The" is unknown without lowercasing
    lower = WordTokenizer.from_corpus(CORPUS, min_freq=2, lowercase=True)
    assert lower.encode("The cat sat.") == [7, 5, 6, 4]
    capped = WordTokenizer.from_corpus(CORPUS, max_size=2)
    assert capped.words == [".", "cat"] and capped.vocab_size == 6


def test_word_round_trip_after_normalisation():
    text = 'Two young, White males (twins) said "hi" near a T-shirt stand.'
    tok = WordTokenizer.from_corpus([text])
    assert tok.decode(tok.encode(text)) == text
    messy = "Ｔｗｏ  young ,White males"  # full-width letters, odd spacing
    assert tok.canonical(messy) == "Two young, White males"
    assert tok.decode(tok.encode(messy)) == tok.canonical(messy)
    rotten = "though the film's scenario is certainly not earthshaking , this depiction ."
    rt = WordTokenizer.from_corpus([rotten])
    tidy = "though the film's scenario is certainly not earthshaking, this depiction."
    assert rt.decode(rt.encode(rotten)) == tidy == rt.canonical(rotten)


def test_word_splitter_and_joiner():
    assert split_words("isn't it, Bob?") == ["isn't", "it", ",", "Bob", "?"]
    for text in ["rock 'n' roll", "50% off (now)!", "and/or", "Männer – im Freien…"]:
        assert join_words(split_words(text)) == text


def test_word_errors():
    with pytest.raises(ValueError, match="min_freq"):
        WordTokenizer.from_corpus(CORPUS, min_freq=0)
    with pytest.raises(ValueError, match="lower min_freq"):
        WordTokenizer.from_corpus(CORPUS, min_freq=5)
    with pytest.raises(ValueError, match="empty corpus"):
        WordTokenizer.from_corpus(["", "  "])


def test_encode_batch_pads_and_keeps_eos():
    tok = WordTokenizer.from_corpus(CORPUS, min_freq=2)
    out = tok.encode_batch(["the cat sat.", "sat"], length=4, add_bos=True, add_eos=True)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[1, 7, 5, 2], [1, 6, 2, 0]])


def test_tiktoken_gpt2_specials_and_exact_round_trip(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert (gpt2.bos_id, gpt2.eos_id, gpt2.pad_id) == (50256, 50256, 50257)
    assert gpt2.vocab_size == 50304 and gpt2.vocab_size % 64 == 0
    text = "Déjà vu — <|endoftext|> is text here 🙂\n\ttabs"
    ids = gpt2.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == ids[-1] == 50256 and 50256 not in ids[1:-1]
    assert gpt2.decode(ids) == text
    padded = gpt2.encode_batch(["Hello world"], length=5, add_eos=True)
    np.testing.assert_array_equal(padded, [[15496, 995, 50256, 50257, 50257]])
    assert gpt2.decode([15496, 50257, 50300], skip_special=False) == "Hello<|pad|><|unused:50300|>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gpt2.decode([50304])


def test_tiktoken_cl100k_vocab_padded(gpt2):
    try:
        tok = TiktokenTokenizer("cl100k_base")
    except RuntimeError as error:
        pytest.skip(str(error))
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (100257, 100277, 100288)
    assert tok.decode(tok.encode("exactly this")) == "exactly this"


def test_tiktoken_unknown_encoding_lists_known():
    with pytest.raises(ValueError, match="gpt2"):
        TiktokenTokenizer("gpt5_base")


def test_pair_tokenizer_halves():
    source = WordTokenizer.from_corpus(["ein Hund ."])
    target = WordTokenizer.from_corpus(["a dog ."])
    pair = PairTokenizer(source, target)
    assert source_tokenizer(pair) is source and target_tokenizer(pair) is target
    assert pair.vocab_size == target.vocab_size and pair.pad_id == 0
    assert pair.encode("a dog .") == target.encode("a dog .")
    assert pair.decode([1, *target.encode("a dog ."), 2, 0]) == "a dog."
    assert source_tokenizer(target) is target


def test_pair_refuses_different_pads(gpt2):
    with pytest.raises(ValueError, match="pad_id"):
        PairTokenizer(gpt2, WordTokenizer.from_corpus(["x"]))


def check_save_load(tokenizer, directory, kind):
    tokenizer.save(directory)
    saved = json.loads((directory / "zoo_tokenizer.json").read_text())
    assert saved["kind"] == kind
    loaded = load_tokenizer(directory)
    assert type(loaded) is type(tokenizer)
    text = "The cat sat!"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.vocab_size == tokenizer.vocab_size and loaded.pad_id == tokenizer.pad_id
    return saved, loaded


def test_save_load_char_word_pair(tmp_path):
    word = WordTokenizer.from_corpus(CORPUS, lowercase=True, nfkc=False)
    char = CharTokenizer.from_corpus(CORPUS)
    check_save_load(char, tmp_path / "char", "char")
    saved, loaded = check_save_load(word, tmp_path / "word", "word")
    assert saved["state"]["lowercase"] is True and loaded.words == word.words
    saved, pair = check_save_load(PairTokenizer(char, word), tmp_path / "pair", "pair")
    assert saved["state"]["source"]["kind"] == "char"
    assert pair.source.encode("cat") == char.encode("cat")


def test_save_load_tiktoken(tmp_path, gpt2):
    saved, _ = check_save_load(gpt2, tmp_path, "tiktoken")
    assert saved["state"] == {"encoding": "gpt2", "pretrained": False}


def test_a_saved_state_of_the_wrong_types_is_damaged(tmp_path):
    """Entries that zoo never writes (a word list of numbers, a flag as text, a pair half that
    is not an object) are refused when the file is read, not left to fail in a later call."""
    for kind, state, entry in (
        ("word", {"words": [1, 2], "lowercase": False, "nfkc": True}, "'words'"),
        ("word", {"words": ["cat"], "lowercase": "yes", "nfkc": True}, "'lowercase'"),
        ("char", {"chars": 7}, "'chars'"),
        ("pair", {"source": "char", "target": {}}, "'source'"),
    ):
        (tmp_path / "zoo_tokenizer.json").write_text(json.dumps({"kind": kind, "state": state}))
        with pytest.raises(ValueError, match=rf"is damaged \(missing or wrong entry {entry}"):
            load_tokenizer(tmp_path)


def test_word_options_are_the_keywords_of_from_corpus():
    parameters = inspect.signature(WordTokenizer.from_corpus).parameters.values()
    keywords = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert list(WordOptions.__annotations__) == keywords


def test_build_tokenizer_kinds():
    assert isinstance(build_tokenizer("char", CORPUS), CharTokenizer)
    word = build_tokenizer("word", CORPUS, min_freq=2)
    assert word.words == [".", "cat", "sat", "the"]


def test_build_tokenizer_tiktoken(gpt2):
    assert build_tokenizer("tiktoken:gpt2").vocab_size == 50304
    assert build_tokenizer("tiktoken").encode("Hello world") == [15496, 995]


def test_build_tokenizer_errors():
    with pytest.raises(ValueError, match=r"'bpe'.*char.*word.*tiktoken:NAME"):
        build_tokenizer("bpe", CORPUS)
    with pytest.raises(ValueError, match="texts"):
        build_tokenizer("word")
    with pytest.raises(TypeError, match=r"\['min_count'\].*min_freq"):
        build_tokenizer("word", CORPUS, min_count=2)
    with pytest.raises(TypeError, match="takes no options"):
        build_tokenizer("char", CORPUS, lowercase=True)


def test_tiktoken_offline_without_its_cache_is_one_os_error(monkeypatch, tmp_path, capsys):
    """Offline with an empty cache tiktoken raises requests' ConnectionError: zoo says what to
    do, as an OSError the CLI prints on one line (exit 1), with no chained traceback."""
    import tiktoken
    from requests.exceptions import ConnectionError as RequestsConnectionError

    def offline(name):
        raise RequestsConnectionError(f"Failed to resolve the host of {name}.tiktoken")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(OSError, match="set TIKTOKEN_CACHE_DIR") as error:
        TiktokenTokenizer("r50k_base")
    assert error.value.__cause__ is None and error.value.__suppress_context__
    assert "(ConnectionError: Failed to resolve the host of r50k_base.tiktoken)" in str(error.value)

    from zoo.cli import main

    (tmp_path / "train.jsonl").write_text('{"text": "a b c"}\n')
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{tmp_path}",
            "--tokenizer", "tiktoken:r50k_base", "--steps", "1", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(
        "zoo train: error: could not load the tiktoken"
    )
    assert "Traceback" not in errors[0]
