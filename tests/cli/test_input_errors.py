"""Bad input to `zoo train` / `zoo eval`: a clear one-line error, or a decision said out loud."""

from __future__ import annotations

import json
import logging
import re

import jax
import pytest

import zoo
from tests.cli.conftest import reviews, write_jsonl
from zoo.cli import main
from zoo.data import WordTokenizer
from zoo.interop import save_hf

FAST = ["--steps", "1", "--batch-size", "8", "--max-len", "16", "--eval-limit", "1",
        "--no-progress", "--json"]  # fmt: skip
SYNTHETIC = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A saved (untrained) classifier with a word tokenizer of the reviews, and their folder."""
    root = tmp_path_factory.mktemp("run")
    data = root / "reviews"
    write_jsonl(data, "train", reviews(64, seed=0))
    write_jsonl(data, "validation", reviews(16, seed=1))
    tokenizer = WordTokenizer.from_corpus(row["text"] for row in reviews(64, seed=0))
    model = zoo.create("classifier-tiny", key=jax.random.key(0), max_positions=16,
                       vocab_size=tokenizer.vocab_size)  # fmt: skip
    zoo.save(model, root / "run", tokenizer=tokenizer)
    return root / "run", data


@pytest.mark.slow
def test_eval_on_a_folder_with_only_a_test_file(run_dir, tmp_path, capsys):
    out, _ = run_dir
    held = tmp_path / "held"
    write_jsonl(held, "test", reviews(12, seed=5))
    # before: "no train file in ...; expected train.jsonl"
    assert main(["eval", str(out), "--data", f"json:{held}", "--split", "test", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["split"], result["examples"]) == ("test", 12)
    # one file is read as the split --split names (before: the train split, with a holdout)
    single = f"json:{held / 'test.jsonl'}"
    assert main(["eval", str(out), "--data", single, "--split", "test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["confusion_matrix"] == result["confusion_matrix"]
    err = _error(capsys, ["eval", str(out), "--data", f"json:{held}", "--split", "dev"])
    assert "has no 'dev' split (its splits: ['test']); add dev.jsonl to" in err
    err = _error(capsys, ["eval", str(out), "--data", f"json:{held}", "--split", single[5:]])
    assert "--split takes a split name, not a file" in err


def test_eval_reports_the_unknown_token_rate(run_dir, tmp_path, capsys, caplog):
    out, _ = run_dir
    foreign = tmp_path / "foreign"
    write_jsonl(foreign, "validation", [{"text": "zzz qqq good", "label": 1}] * 4)
    with caplog.at_level(logging.WARNING, logger="zoo.data"):
        assert main(["eval", str(out), "--data", f"json:{foreign}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unknown_token_rate"] == pytest.approx(2 / 3, 1e-3)
    assert "67% of the tokens of the 'validation' split are unknown" in caplog.text


def test_init_keeps_its_own_tokenizer(run_dir, capsys):
    out, data = run_dir
    argv = ["train", "classifier", "--init", str(out), "--data", f"json:{data}", "--out",
            str(out.parent / "second"), "--tokenizer", "char", *FAST]  # fmt: skip
    assert "--tokenizer char would replace the tokenizer of --init" in _error(capsys, argv)


def test_init_from_a_folder_without_tokenizer_files(tmp_path, capsys):
    save_hf(zoo.create("gpt-tiny", key=jax.random.key(0)), tmp_path / "hf")
    (tmp_path / "text.txt").write_text("abc abc abc " * 50)
    argv = ["train", "gpt", "--init", str(tmp_path / "hf"), "--data",
            f"text:{tmp_path / 'text.txt'}", "--out", str(tmp_path / "o"), *FAST]  # fmt: skip
    # before: "this HuggingFace tokenizer has no pad token", from a tokenizer transformers guessed
    assert "has no tokenizer files (tokenizer.json, vocab.txt" in _error(capsys, argv)


@pytest.mark.parametrize(
    "make_out, message",
    [
        (lambda tmp: "", "--out is empty; name the run directory"),
        (lambda tmp: tmp / "file", "is a file, not a directory"),
        (lambda tmp: tmp / "file" / "run", "lies under .*file, which is a file"),
    ],
)
def test_bad_out_directories(tmp_path, capsys, make_out, message):
    (tmp_path / "file").write_text("x")
    err = _error(capsys, [*SYNTHETIC, "--out", str(make_out(tmp_path)), *FAST])
    assert re.search(message, err), err


def test_a_read_only_out_directory(tmp_path, capsys, monkeypatch):
    # root may write anywhere, so stand in a read-only filesystem's answer
    monkeypatch.setattr("zoo.cli._run_dir.os.access", lambda path, mode: False)
    err = _error(capsys, [*SYNTHETIC, "--out", str(tmp_path / "run"), *FAST])
    assert "is not writable (read-only or not yours)" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--lr", "nan"], "--lr: nan is not a finite number > 0"),
        (
            ["--clip-norm", "-1"],
            "--clip-norm: -1 is not a finite number >= 0 (0 turns clipping off)",
        ),
    ],
)
def test_training_numbers_are_checked(tmp_path, capsys, option, message):
    with pytest.raises(SystemExit) as stopped:  # refused by the flag's type, as argparse refuses
        main([*SYNTHETIC, "--out", str(tmp_path / "r"), *option, *FAST])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_max_len_sizes_a_model_for_synthetic_data_and_resume_keeps_seed_and_schedule(
    tmp_path, capsys
):
    out = tmp_path / "run"
    common = [*SYNTHETIC, "--out", str(out), "--batch-size", "8", "--eval-limit", "1",
              "--no-progress", "--json", "--schedule", "constant"]  # fmt: skip
    assert main([*common, "--steps", "1", "--max-len", "12"]) == 0  # before: --max-len ignored
    capsys.readouterr()
    assert zoo.load(out).config.max_positions == 12
    assert json.loads((out / "train_args.json").read_text())["seed"] == 0
    err = _error(capsys, [*common, "--steps", "2", "--max-len", "12", "--resume", "--seed", "3"])
    assert "--resume with --seed 3, but the run in" in err and "with --seed 0" in err
    assert "evaluation could overlap" in err
    changed = [*common[:-1], "cosine", "--steps", "2", "--max-len", "12", "--resume"]
    assert "started with --schedule constant" in _error(capsys, changed)
    short = [*SYNTHETIC, "--out", str(tmp_path / "short"), *FAST, "--max-len", "4"]
    assert "max_positions=4" in _error(capsys, short)  # 11 tokens do not fit in 4


def test_a_missing_column_names_the_flag(run_dir, tmp_path, capsys):
    _, data = run_dir
    argv = ["train", "classifier", "--preset", "classifier-tiny", "--data", f"json:{data}",
            "--out", str(tmp_path / "r"), "--text-column", "review", *FAST]  # fmt: skip
    # before: "...; choose one with text_column=..." (the Python keyword, at the command line)
    assert (
        _error(capsys, argv)
        .splitlines()[-1]
        .endswith(
            "column 'review' is not in the 'train' split; its columns are ['text', 'label']; "
            "choose one with --text-column (text_column= in Python)"
        )
    )


def test_a_conversation_without_a_reply_is_refused_in_cli_terms(tmp_path, capsys):
    pytest.importorskip("jinja2", reason="chat data needs jinja2 (zoo[chat])")
    hello = [{"role": "user", "content": "hello there"}]
    rows = [{"messages": [*hello, {"role": "assistant", "content": "hi"}]}] * 8
    write_jsonl(tmp_path / "chats", "train", [{"messages": hello}, *rows])
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "word", "--data",
            f"json:{tmp_path / 'chats'}", "--out", str(tmp_path / "r"), *FAST]  # fmt: skip
    # before: "...; drop the row, or read it as a prompt (require_assistant=False)", a keyword
    # the command line has no flag for
    assert (
        _error(capsys, argv)
        .splitlines()[-1]
        .endswith(
            "row 0 has no assistant turn (its roles: ['user']): there is nothing to learn from it; "
            "drop the row (in Python, read it as a prompt with require_assistant=False)"
        )
    )


@pytest.mark.parametrize("command", ["eval"])  # zoo train mixes them: test_data_mix.py
def test_a_second_data_flag_is_refused_not_silently_dropped(command, capsys):
    # before: argparse kept the last --data, and the run read one of the two datasets
    argv = ["eval", "unused-run"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--data", "json:first", "--data", "json:second"])
    assert exit_info.value.code == 2
    assert (
        "argument --data: given twice (json:first, then json:second): a run reads one dataset"
        in capsys.readouterr().err
    )
