"""`zoo eval`: JSON metrics of a trained model, checked against predictions computed by hand."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer

FAST = ["--batch-size", "8", "--max-len", "16", "--eval-limit", "1", "--no-progress", "--json"]


def _train(capsys, out, *argv: str) -> None:
    assert main(["train", *argv, "--out", str(out), *FAST]) == 0, capsys.readouterr().err
    capsys.readouterr()


def _eval(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_classifier_accuracy_and_confusion_match_the_predictions(tmp_path, capsys, review_dir):
    out = tmp_path / "run"
    _train(capsys, out, "classifier", "--preset", "classifier-tiny", "--data",
           f"json:{review_dir}", "--steps", "6", "--lr", "3e-3")  # fmt: skip
    result = _eval(capsys, str(out), "--data", f"json:{review_dir}", "--split", "validation")

    model, tokenizer = zoo.load(out), load_tokenizer(out)
    rows = [json.loads(line) for line in (review_dir / "validation.jsonl").open()]
    tokens = tokenizer.encode_batch([row["text"] for row in rows], length=16, add_bos=True)
    predictions = np.asarray(jnp.argmax(jax.vmap(model)(jnp.asarray(tokens)), axis=-1))
    labels = np.array([row["label"] for row in rows])
    confusion = np.zeros((2, 2), int)
    for label, predicted in zip(labels, predictions, strict=True):
        confusion[label, predicted] += 1
    assert result["examples"] == 40
    assert result["accuracy"] == pytest.approx(float(np.mean(predictions == labels)), abs=1e-12)
    assert result["confusion_matrix"] == confusion.tolist()
    assert result["loss"] > 0 and result["flavor"] == "classifier"


def test_language_model_loss_and_perplexity(tmp_path, capsys):
    text = tmp_path / "text"
    text.mkdir()
    (text / "train.txt").write_text("to be or not to be, that is the question. " * 40)
    (text / "validation.txt").write_text("to be or not to be. " * 10)
    out = tmp_path / "run"
    _train(capsys, out, "gpt", "--preset", "gpt-tiny", "--data", f"text:{text}", "--steps", "2")
    result = _eval(capsys, str(out), "--data", f"text:{text}", "--split", "validation")
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert result["tokens"] == len("to be or not to be. " * 10)  # every next character, + eos
    assert 0 < result["loss"] < math.log(load_tokenizer(out).vocab_size) + 1


def test_translator_bleu(tmp_path, capsys, pairs_dir):
    out = tmp_path / "run"
    _train(capsys, out, "translator", "--preset", "translator-tiny", "--data",
           f"json:{pairs_dir}", "--steps", "2")  # fmt: skip
    result = _eval(capsys, str(out), "--data", f"json:{pairs_dir}", "--split", "test")
    assert result["examples"] == 16 and result["beam_size"] == 1
    assert 0.0 <= result["bleu"] <= 100.0 and 0.0 <= result["token_accuracy"] <= 1.0
    assert len(result["samples"]) == 3 and set(result["samples"][0]) == {
        "source", "reference", "hypothesis"
    }  # fmt: skip


def test_eval_errors(tmp_path, capsys, review_dir):
    assert main(["eval", str(tmp_path / "none"), "--data", f"json:{review_dir}"]) == 2
    assert "config.json" in capsys.readouterr().err
    write_jsonl(tmp_path / "empty", "train", [])
    assert main(["eval", str(tmp_path), "--data", "synthetic:rot13"]) == 2
    assert "zoo eval reads" in capsys.readouterr().err
