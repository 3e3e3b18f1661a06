"""`zoo generate / translate / classify / plot-attention` on saved models, against the Python API."""

import json
import logging
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.cli import main
from zoo.data import CharTokenizer
from zoo.decoding import SamplingSettings
from zoo.decoding.text import classify_texts, generate_texts, translate_texts

TOKENIZER = CharTokenizer(string.ascii_lowercase + " .!")


def _saved(tmp_path_factory, preset, **overrides):
    model = zoo.create(preset, key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size, **overrides)
    directory = tmp_path_factory.mktemp(preset)
    zoo.save(model, directory, tokenizer=TOKENIZER)
    return model, str(directory)


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    return _saved(tmp_path_factory, "gpt-tiny")


@pytest.fixture(scope="module")
def translator_dir(tmp_path_factory):
    return _saved(tmp_path_factory, "translator-tiny")


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return _saved(tmp_path_factory, "classifier-tiny", num_classes=3)


def _json_lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_generate_prints_the_greedy_continuation(gpt_dir, capsys):
    model, directory = gpt_dir
    args = ["generate", directory, "--prompt", "hello", "--prompt", "ab", "--max-new-tokens", "7"]
    assert main([*args, "--json"]) == 0
    rows = _json_lines(capsys)
    expected = generate_texts(model, TOKENIZER, ["hello", "ab"], max_new_tokens=7)
    assert [row["output"] for row in rows] == expected
    # greedy continuation of "hello", recomputed token by token with the full forward pass
    ids = TOKENIZER.encode("hello")
    for _ in range(7):
        next_id = int(np.argmax(model(jnp.array(ids, jnp.int32))[-1]))
        if next_id == TOKENIZER.eos_id:
            break
        ids.append(next_id)
    assert rows[0]["output"] == TOKENIZER.decode(ids[5:])


def test_generate_samples_with_the_seed_as_the_python_api(gpt_dir, capsys):
    model, directory = gpt_dir
    args = ["generate", directory, "--prompt", "hello", "--max-new-tokens", "7", "--json"]
    sampled = ["--temperature", "0.9", "--top-k", "5", "--seed", "3"]
    assert main([*args, *sampled]) == 0
    [row] = _json_lines(capsys)
    sampling, key = SamplingSettings(0.9, top_k=5), jax.random.key(3)
    expected = generate_texts(model, TOKENIZER, ["hello"], max_new_tokens=7, sampling=sampling,
                              key=key)  # fmt: skip
    assert row["output"] == expected[0]
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        generate_texts(model, TOKENIZER, ["hello"], max_new_tokens=7, temperature=0.9, key=key)
    with pytest.raises(SystemExit):  # refused by the flag's type, as argparse refuses
        main([*args, "--temperature", "-1"])
    assert "--temperature: -1 is not a finite number >= 0" in capsys.readouterr().err


def test_translate_matches_python_api_and_beam_option(translator_dir, capsys):
    model, directory = translator_dir
    assert main(["translate", directory, "hey there", "abc", "--json", "--max-len", "9"]) == 0
    rows = _json_lines(capsys)
    assert [r["translation"] for r in rows] == translate_texts(
        model, TOKENIZER, ["hey there", "abc"], max_len=9
    )
    assert main(["translate", directory, "abc", "--beam-size", "3", "--max-len", "9"]) == 0
    beam = capsys.readouterr().out.strip()
    assert beam == translate_texts(model, TOKENIZER, ["abc"], beam_size=3, max_len=9)[0]


def test_classify_prints_argmax_and_probabilities(classifier_dir, capsys):
    model, directory = classifier_dir
    assert main(["classify", directory, "a gorgeous witty film", "dull", "--json"]) == 0
    rows = _json_lines(capsys)
    probs = classify_texts(model, TOKENIZER, ["a gorgeous witty film", "dull"])
    for row, expected in zip(rows, probs):
        np.testing.assert_allclose(row["probabilities"], expected, rtol=1e-5)
        assert row["label"] == int(np.argmax(expected))
        assert abs(sum(row["probabilities"]) - 1.0) < 1e-5


def test_wrong_flavor_and_missing_directory_are_clear_errors(gpt_dir, tmp_path, capsys):
    _, directory = gpt_dir
    assert main(["translate", directory, "abc"]) == 2
    assert "holds a gpt model; this command needs a translator" in capsys.readouterr().err
    assert main(["classify", str(tmp_path / "nothing"), "abc"]) == 2
    assert "not a model directory" in capsys.readouterr().err
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_em')  # cut short
    assert main(["generate", str(tmp_path), "--prompt", "abc"]) == 2
    assert f"{tmp_path / 'config.json'} is damaged (not valid JSON" in capsys.readouterr().err


def test_an_empty_text_is_refused(translator_dir, gpt_dir, capsys):
    # an empty source used to be translated from its lone eos token into an arbitrary sentence
    assert main(["translate", translator_dir[1], "abc", " "]) == 2
    assert "text 1 is empty; give some text" in capsys.readouterr().err
    with pytest.raises(ValueError, match="text 0 is empty"):
        generate_texts(gpt_dir[0], TOKENIZER, [""], max_new_tokens=2)


@pytest.mark.parametrize("kind", ["cross", "encoder"])
def test_plot_attention_writes_one_panel_per_head(translator_dir, tmp_path, kind):
    pytest.importorskip("matplotlib")
    from PIL import Image

    _, directory = translator_dir
    out = tmp_path / f"{kind}.png"
    assert main(["plot-attention", directory, "hey", "--out", str(out), "--kind", kind]) == 0
    width, height = Image.open(out).size
    assert width > 100 and height > 100


def test_prompts_outside_the_vocabulary_are_warned_about(gpt_dir, caplog):
    model, _ = gpt_dir
    with caplog.at_level(logging.WARNING, logger="zoo.data"):
        generate_texts(model, TOKENIZER, ["hello"], max_new_tokens=1)
        assert caplog.text == ""
        generate_texts(model, TOKENIZER, ["HELLO there"], max_new_tokens=1)  # 5 of 11 unknown
    assert "45% of the tokens of the prompts are unknown to the tokenizer (<unk>)" in caplog.text


def test_an_unreachable_hub_is_one_line_not_a_traceback(monkeypatch, capsys):
    import zoo.interop.files

    def offline(*args, **kwargs):
        raise OSError("could not get 'org/model' from the HuggingFace hub (offline?)")

    monkeypatch.setattr(zoo.interop.files, "resolve", offline)
    monkeypatch.setattr(zoo.interop.loading, "resolve", offline)
    assert main(["generate", "hf:org/model", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "zoo generate: error: could not get 'org/model' from the HuggingFace hub (offline?)\n"
    )


@pytest.mark.parametrize("flag", ["--top-k", "--top-p"])
def test_filters_without_sampling_are_refused_naming_the_flag(gpt_dir, flag, capsys):
    _, directory = gpt_dir
    value = "5" if flag == "--top-k" else "0.9"
    # before: greedy decoding, the flag silently ignored
    assert main(["generate", directory, "--prompt", "hi", flag, value]) == 2
    assert capsys.readouterr().err == (
        f"zoo generate: error: {flag} only acts when sampling: pass --temperature above 0 "
        f"(0 is greedy), or drop {flag}\n"
    )
