"""`zoo train gpt` on conversations: `--show-data N` prints what training would read (the
trained tokens marked, the lengths, what is cut, dropped and packed) and writes nothing;
`--train-on`, `--messages-column` and `--role` choose the trained tokens and read other
layouts; `--sample-every N` logs greedy replies to held-out prompts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from tests.cli.test_chat_train_cli import TRAIN, review_chats
from zoo.cli import main
from zoo.decoding.chat import reply

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
SHOW = ["train", "gpt", "--preset", "llama-tiny", "--tokenizer", "char", "--batch-size", "1"]


def chat(user: str, answer: str, *more: str) -> dict:
    """A conversation: the user's message, the answer, then more (user, answer) turns."""
    turns = [user, answer, *more]
    roles = ["user", "assistant"] * (len(turns) // 2)
    return {"messages": [{"role": r, "content": c} for r, c in zip(roles, turns, strict=True)]}


@pytest.fixture
def small(tmp_path) -> Path:
    rows = [chat("hi", "yo"), chat("tell me", "no"), chat("long " * 8, "ok"), chat("a", "bb")]
    write_jsonl(tmp_path / "small", "train", rows)
    write_jsonl(tmp_path / "small", "validation", rows[:2])
    return tmp_path / "small"


def test_show_data_marks_the_trained_text_and_counts_the_cut(small, tmp_path, capsys):
    out = tmp_path / "run"
    status = main([*SHOW, "--data", f"json:{small}", "--max-len", "30", "--show-data", "2",
                   "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0 and not out.exists()  # nothing trained, nothing written
    blocks = printed.split("--- conversation ")
    # zoo's default template, char by char: the reply and its end of turn are trained
    assert blocks[1] == "0 ---\n<bos>user:\nhi<eos>\nassistant:\n[[yo<eos>]]\n\n"
    assert blocks[2].startswith("1 ---\n<bos>user:\ntell me<eos>\nassistant:\n[[no<eos>]]\n")
    assert len(blocks) == 3  # two shown
    # lengths: bos + "user:\n" + text + eos + "\n" + "assistant:\n" + reply + eos + "\n"
    lengths = [1 + 6 + len(text) + 2 + 11 + len(answer) + 2
               for text, answer in (("hi", "yo"), ("tell me", "no"), ("long " * 8, "ok"),
                                    ("a", "bb"))]  # fmt: skip
    shown = ", ".join(f"p{q} {round(float(np.percentile(lengths, q)))}" for q in (50, 90, 99))
    assert f"lengths in tokens (4 train conversations): {shown}, max {max(lengths)}" in printed
    # "long " * 8 (63 tokens) is cut at 31 before its reply: dropped
    assert "cut to 31 tokens (max_len + 1): 1; dropped (every trained token cut away): 1" in printed
    assert "packed: 3 conversations into" in printed


def test_show_data_options_are_refused_without_chat_data(tmp_path, capsys, review_dir):
    base = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{review_dir}"]
    assert main([*base, "--show-data", "1", "--chat-format", "none"]) == 2
    assert "--show-data is for chat data" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "r"), "--train-on", "last"]) == 2
    assert "--train-on is for chat data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--show-data", "0"])
    assert "--show-data takes a positive number, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused by the flag's type, as argparse refuses
        main([*base, "--out", str(tmp_path / "h"), "--holdout", "1.5"])
    assert "--holdout: 1.5 is not a finite number in (0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()  # refused before the run folder is touched


def trained_line(printed: str) -> str:
    return next(line for line in printed.splitlines() if line.startswith("trained tokens"))


def test_train_on_last_trains_only_the_final_reply(tmp_path, capsys):
    rows = [chat("q1", "aa", "q2", "bbb") for _ in range(3)]
    write_jsonl(tmp_path / "turns", "train", rows)
    write_jsonl(tmp_path / "turns", "validation", rows[:1])
    base = [*SHOW, "--data", f"json:{tmp_path / 'turns'}", "--max-len", "80", "--show-data", "1"]
    assert main([*base, "--train-on", "last"]) == 0
    last = capsys.readouterr().out
    assert "assistant:\naa<eos>\nuser:" in last and "[[bbb<eos>]]" in last
    assert main([*base, "--train-on", "assistant"]) == 0
    every = capsys.readouterr().out
    assert "[[aa<eos>]]" in every and "[[bbb<eos>]]" in every
    # each conversation: "aa" + eos and "bbb" + eos trained with assistant, the last alone
    assert trained_line(last).startswith("trained tokens: 12 of")
    assert trained_line(every).startswith("trained tokens: 21 of")


def test_messages_column_and_roles_read_another_layout(tmp_path, capsys):
    turns = [[{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]] * 3
    write_jsonl(tmp_path / "other", "train", [{"dialog": t} for t in turns])
    base = [*SHOW, "--data", f"json:{tmp_path / 'other'}", "--max-len", "40", "--show-data", "1"]
    assert main([*base, "--messages-column", "dialog", "--role", "human=user",
                 "--role", "bot=assistant"]) == 0  # fmt: skip
    assert "<bos>user:\nhi<eos>\nassistant:\n[[yo<eos>]]\n" in capsys.readouterr().out
    assert main([*base, "--messages-column", "dialog", "--role", "human"]) == 2
    assert "--role 'human' is not FROM=TO" in capsys.readouterr().err
    assert main([*base, "--messages-column", "dialog", "--role", "bot=robot"]) == 2
    assert "--role" in capsys.readouterr().err


@pytest.mark.slow
def test_sample_every_logs_greedy_replies_to_held_out_prompts(tmp_path, capsys):
    folder = tmp_path / "reviews"
    write_jsonl(folder, "train", review_chats(48, seed=0))
    validation = review_chats(8, seed=1)
    write_jsonl(folder, "validation", validation)
    run = tmp_path / "run"
    status = main(["train", "gpt", "--data", f"json:{folder}", "--out", str(run), *TRAIN,
                   "--steps", "4", "--sample-every", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0, err
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [2, 2, 2, 4, 4, 4]
    assert sum("zoo train: step 4 sample:" in line for line in err.splitlines()) == 3
    model, tokenizer = zoo.serialize.load_with_tokenizer(run)  # the model of step 4
    for row in rows[3:]:
        asked = next(r for r in validation if r["messages"][0]["content"] in row["prompt"])
        assert row["reply"] == reply(model, tokenizer, asked["messages"][0]["content"]).text
        assert row["reference"] == asked["messages"][1]["content"]
