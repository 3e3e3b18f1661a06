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


CHAT_RUN = ["--preset", "llama-tiny", "--tokenizer", "word", "--batch-size", "4", "--max-len",
            "32", "--lr", "3e-3", "--no-progress", "--json"]  # fmt: skip


def _chat_reference(run, spec: str, seed: int) -> tuple[float, float, int]:
    """(loss, token accuracy, scored tokens) of the held-out conversations of `spec` drawn with
    `seed`, from the model's logits in numpy."""
    from zoo.data.chat.datasets import chat_evaluation

    model, tokenizer = zoo.serialize.load_with_tokenizer(run)
    config = zoo.data.ChatDataConfig(seed=seed, max_len=model.config.max_positions, pack=False)
    chats = chat_evaluation(zoo.data.load_spec(spec), tokenizer, config=config)
    assert chats.name == "validation (held out of train)"
    nll, correct, scored = 0.0, 0, 0
    for index in range(len(chats.batches)):
        batch = chats.batches.batch(index)
        tokens = np.asarray(batch["tokens"])
        logits = np.asarray(jax.vmap(model)(jnp.asarray(tokens[:, :-1])), np.float64)
        targets = tokens[:, 1:]
        weight = (targets != tokenizer.pad_id) & (np.asarray(batch["loss_mask"])[:, 1:] != 0)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
        nll -= float(picked[weight].sum())
        correct += int((logits.argmax(-1) == targets)[weight].sum())
        scored += int(weight.sum())
    return nll / scored, correct / scored, scored


@pytest.mark.slow
def test_a_chat_run_on_one_file_is_scored_on_what_training_held_out(tmp_path, capsys):
    from tests.cli.test_chat_train_cli import review_chats

    rows = review_chats(48, seed=0)
    file = tmp_path / "chats.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    folder = tmp_path / "folder"
    write_jsonl(folder, "train", rows)
    run = tmp_path / "run"
    assert main(["train", "gpt", "--data", f"json:{file}", "--out", str(run), "--steps", "3",
                 "--seed", "3", *CHAT_RUN]) == 0, capsys.readouterr().err  # fmt: skip
    capsys.readouterr()

    # before: the file was read as the validation split, all 48 conversations scored
    found = _eval(capsys, str(run), "--data", f"json:{file}")
    assert (found["split"], found["conversations"]) == ("validation (held out of train)", 5)
    in_folder = _eval(capsys, str(run), "--data", f"json:{folder}")
    assert in_folder == found | {"data": f"json:{folder}"}
    # the run's own seed (3, train_args.json) drew them: before, --seed's default 0 did
    loss, accuracy, scored = _chat_reference(run, f"json:{file}", seed=3)
    assert found["loss"] == pytest.approx(loss, rel=1e-5)
    assert found["tokens"] == scored == 2 * 5  # "positive" or "negative", then the end of turn
    assert found["token_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert 0.0 < found["token_accuracy"] < 1.0  # some right, some wrong: the count is checked
    assert _chat_reference(run, f"json:{file}", seed=0)[0] != pytest.approx(loss, rel=1e-5)
    # another file is still read as the split --split names, the training file as train
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(row) + "\n" for row in review_chats(8, seed=1)))
    assert _eval(capsys, str(run), "--data", f"json:{other}")["conversations"] == 8
    trained = _eval(capsys, str(run), "--data", f"json:{file}", "--split", "train")
    assert (trained["split"], trained["conversations"]) == ("train", 48)


def test_the_file_a_run_trained_on_is_split_as_training_split_it(tmp_path, capsys):
    from tests.cli.conftest import reviews
    from zoo.data.tokenizers.word import WordTokenizer

    rows = reviews(60, seed=0)
    tokenizer = WordTokenizer.from_corpus(row["text"] for row in rows)
    model = zoo.create("classifier-tiny", key=jax.random.key(0), max_positions=16,
                       vocab_size=tokenizer.vocab_size)  # fmt: skip
    file, folder = tmp_path / "reviews.jsonl", tmp_path / "reviews"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_jsonl(folder, "train", rows)
    write_jsonl(folder, "validation", reviews(10, seed=1))
    for name, data in (("on_file", f"json:{file}"), ("on_folder", f"json:{folder}")):
        run = tmp_path / name
        zoo.save(model, run, tokenizer=tokenizer)
        (run / "train_args.json").write_text(json.dumps({"data": data, "seed": 0}))
    # before: read as the validation split, all 60 examples, 54 of them trained on
    held = _eval(capsys, str(tmp_path / "on_file"), "--data", f"json:{file}")
    assert (held["split"], held["examples"]) == ("validation (held out of train)", 6)
    # trained on the whole train file of a folder with a validation file: read as --split
    # names, with a warning that the model was trained on it
    single = f"json:{folder / 'train.jsonl'}"
    assert main(["eval", str(tmp_path / "on_folder"), "--data", single, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["examples"] == 60
    assert "is training data of the run" in captured.err and "--split validation" in captured.err
