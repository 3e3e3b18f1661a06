"""`zoo train gpt --data` on conversations: the format read from the columns, the loss on the
assistant's tokens or all of them, packed or one per row, LoRA on an int8 base, and `zoo chat`
on the run answering as `zoo.chat` does in Python."""

from __future__ import annotations

import functools
import importlib.util
import json
import operator
import os
import random
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main
from zoo.data.chat.tokens import encode_prompt
from zoo.decoding.chat import reply

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
GOOD, BAD, FILLER = ["good", "great", "fun"], ["bad", "dull", "poor"], ["the", "film", "was"]
TRAIN = ["--preset", "llama-tiny", "--tokenizer", "word", "--batch-size", "4", "--max-len", "32",
         "--lr", "3e-3", "--no-progress", "--json"]  # fmt: skip


def review_chats(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        positive = index % 2 == 1
        words = rng.choices(GOOD if positive else BAD, k=2) + rng.choices(FILLER, k=3)
        rng.shuffle(words)
        user = {"role": "user", "content": "review: " + " ".join(words)}
        answer = {"role": "assistant", "content": "positive" if positive else "negative"}
        rows.append({"messages": [user, answer], "text": " ".join(words)})
    return rows


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("chats")
    write_jsonl(folder, "train", review_chats(48, seed=0))
    write_jsonl(folder, "validation", review_chats(8, seed=1))
    return folder


def train(capsys, chats: Path, out: Path, *extra: str) -> tuple[dict, str, list[dict]]:
    status = main(["train", "gpt", "--data", f"json:{chats}", "--out", str(out), *extra])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads(captured.out), captured.err, rows


@pytest.mark.slow
def test_a_chat_run_trains_on_the_assistants_tokens_and_zoo_chat_answers(chats, tmp_path, capsys):
    summary, err, rows = train(capsys, chats, tmp_path / "run", *TRAIN, "--steps", "6")
    assert summary["steps"] == 6
    assert "chat data (messages format, zoo's default chat template, loss on assistant" in err
    assert "train: 48 conversations" in err and "96 trained" in err  # "positive"/"negative" + eos
    for row in rows:
        assert 0 < row["scored"] < row["tokens"]
    model, tokenizer = zoo.serialize.load_with_tokenizer(tmp_path / "run")
    assert main(["chat", str(tmp_path / "run"), "--message", "review: great fun", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    expected = reply(model, tokenizer, "review: great fun")
    assert record["reply"] == expected.text
    assert record["prompt_tokens"] == len(encode_prompt([{"role": "user",
                                                          "content": "review: great fun"}],
                                                        tokenizer))  # fmt: skip


@pytest.mark.slow
def test_zoo_eval_scores_a_chat_run_on_its_conversations(chats, tmp_path, capsys):
    run = tmp_path / "run"
    train(capsys, chats, run, *TRAIN, "--steps", "2")

    def evaluate(data: Path, *extra: str) -> dict:
        assert main(["eval", str(run), "--data", f"json:{data}", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    found = evaluate(chats)
    # the loss of the validation batches zoo.data.chat_data builds for training, one per row
    model, tokenizer = zoo.serialize.load_with_tokenizer(run)
    dataset = zoo.data.load_spec(f"json:{chats}")
    config = zoo.data.ChatDataConfig(pack=False, max_len=32)
    data = zoo.data.chat_data(dataset, tokenizer=tokenizer, config=config)
    statistics = eqx.filter_jit(zoo.tasks.LanguageModeling().statistics)
    parts = [statistics(model, data.validation.batch(i)) for i in range(len(data.validation))]
    total = functools.reduce(operator.add, parts)
    assert (found["split"], found["conversations"], found["train_on"]) == (
        "validation",
        8,
        "assistant",
    )
    assert found["loss"] == pytest.approx(float(total.nll_sum / total.weight), rel=1e-5)
    assert found["tokens"] == int(total.weight) == data.counts["validation"]["trained_tokens"]
    assert found["tokens"] == 2 * 8  # "positive" or "negative", then the end of the turn
    assert found["total_tokens"] == data.counts["validation"]["tokens"]
    # every token but each conversation's first
    assert evaluate(chats, "--train-on", "all")["tokens"] == found["total_tokens"] - 8
    # no validation split: the conversations training held out of train (seed 0, a tenth)
    only_train = tmp_path / "only_train"
    write_jsonl(only_train, "train", review_chats(48, seed=0))
    held = evaluate(only_train)
    assert held["split"] == "validation (held out of train)" and held["conversations"] == 5
    assert main(["eval", str(run), "--data", f"json:{chats}", "--chat-format", "none"]) == 0
    assert "conversations" not in capsys.readouterr().out  # the text column, as plain text


@pytest.mark.slow
def test_every_token_one_per_row_and_plain_text_on_request(chats, tmp_path, capsys):
    options = [*TRAIN, "--steps", "2", "--train-on", "all", "--no-pack"]
    _, err, rows = train(capsys, chats, tmp_path / "all", *options)
    assert "loss on all tokens, one per row" in err
    # every token but each conversation's first is trained; padding is not
    assert all(row["scored"] < row["tokens"] for row in rows)
    train_rows = [row for row in rows if row["split"] == "train"]
    assert sum(row["scored"] for row in train_rows) > 4 * 2 * 10
    _, err, _ = train(capsys, chats, tmp_path / "text", *TRAIN, "--steps", "1",
                      "--chat-format", "none")  # fmt: skip
    assert "chat data" not in err  # the text column, as plain language modelling


def test_chat_options_that_cannot_apply_are_refused(chats, tmp_path, capsys):
    base = ["train", "gpt", "--data", f"json:{chats}", *TRAIN, "--steps", "1"]
    assert main([*base, "--out", str(tmp_path / "a"), "--chat-format", "instruction"]) == 2
    err = capsys.readouterr().err
    assert "row 0 lacks the column 'instruction' of the 'instruction' format" in err
    assert main([*base, "--out", str(tmp_path / "b"), "--streaming"]) == 2
    assert "chat data is read into memory to be packed: drop --streaming" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "c"), "--text-column", "text"]) == 2
    assert "--text-column names a plain-text column" in capsys.readouterr().err
    classifier = ["train", "classifier", "--preset", "classifier-tiny", "--data", f"json:{chats}"]
    assert main([*classifier, "--out", str(tmp_path / "d"), "--chat-format", "messages"]) == 2
    assert "--chat-format messages trains a gpt" in capsys.readouterr().err


@pytest.mark.slow
def test_lora_on_an_int8_base_trains_on_chats_and_chats_back(chats, tmp_path, capsys):
    train(capsys, chats, tmp_path / "base", *TRAIN, "--steps", "2")
    options = ["--init", str(tmp_path / "base"), "--lora", "rank=4,targets=all-linear",
               "--quantize", "int8", "--steps", "2", "--batch-size", "4", "--max-len", "32",
               "--no-progress", "--json"]  # fmt: skip
    summary, err, rows = train(capsys, chats, tmp_path / "lora", *options)
    assert summary["adapter"] and "chat data (messages format" in err
    assert all(0 < row["scored"] < row["tokens"] for row in rows)
    model, tokenizer = zoo.serialize.load_with_tokenizer(tmp_path / "lora")
    assert zoo.lora.quantized_paths(model)  # still int8 when loaded back
    assert main(["chat", str(tmp_path / "lora"), "--message", "review: dull", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["reply"] == reply(model, tokenizer, "review: dull").text


@pytest.mark.slow
@pytest.mark.distributed
def test_on_two_devices_chat_training_and_zoo_chat_match_one_device(chats, tmp_path, capsys):
    pytest.importorskip("orbax.checkpoint", reason="a mesh run needs the distributed extra")
    options = [*TRAIN, "--steps", "3", "--log-every", "1"]
    _, _, alone = train(capsys, chats, tmp_path / "one", *options)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}  # fmt: skip
    zoo_command = [sys.executable, "-m", "zoo"]
    run = tmp_path / "two"
    args = ["train", "gpt", "--data", f"json:{chats}", "--out", str(run), *options,
            "--mesh", "data=2"]  # fmt: skip
    subprocess.run([*zoo_command, *args], env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["scored"] for row in rows] == [row["scored"] for row in alone]
    for row, expected in zip(rows, alone, strict=True):
        assert row["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    chat = [*zoo_command, "chat", str(run), "--message", "review: great", "--json",
            "--mesh", "data=2"]  # fmt: skip
    done = subprocess.run(chat, env=env, check=True, capture_output=True, text=True)
    model, tokenizer = zoo.serialize.load_with_tokenizer(run)
    assert json.loads(done.stdout)["reply"] == reply(model, tokenizer, "review: great").text
