"""`zoo train --template FILE`: the template is saved in the run folder (and by a Python run
given `Outputs(chat_template=...)`), and `zoo chat`, `zoo eval` and `zoo export` use it; zoo's
default template, where a tokenizer has none, is a one-line warning."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from tests.cli.test_chat_train_cli import TRAIN, review_chats
from zoo.cli import main
from zoo.data.chat.datasets import chat_evaluation
from zoo.data.chat.template import DEFAULT_TEMPLATE
from zoo.data.chat.tokens import encode_prompt
from zoo.decoding.chat import ChatFormat, reply

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
# zoo's default with another role line: `user says:` instead of `user:`
TEMPLATE = DEFAULT_TEMPLATE.replace("':\\n'", "' says:\\n'").replace(
    "'assistant:\\n'", "'assistant says:\\n'"
)


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("chats")
    write_jsonl(folder, "train", review_chats(48, seed=0))
    write_jsonl(folder, "validation", review_chats(8, seed=1))
    return folder


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "says.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_template_is_saved_and_zoo_chat_and_eval_use_it(chats, template_file, tmp_path,
                                                            capsys):  # fmt: skip
    run = tmp_path / "run"
    status = main(["train", "gpt", "--data", f"json:{chats}", "--out", str(run), *TRAIN,
                   "--steps", "2", "--template", str(template_file)])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0, err
    assert f"--template {template_file}" in err and "has no chat template" not in err
    assert (run / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE

    model, tokenizer = zoo.serialize.load_with_tokenizer(run)
    question = "review: great fun"
    assert main(["chat", str(run), "--message", question, "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert "chat template" not in captured.err  # the run's own: no warning
    with_template = ChatFormat(tokenizer, template=TEMPLATE)
    assert record["reply"] == reply(model, with_template, question).text
    messages = [{"role": "user", "content": question}]
    expected_ids = encode_prompt(messages, tokenizer, template=zoo.decoding.chat.chat_template(
        tokenizer, TEMPLATE))  # fmt: skip
    # `says` is one more token per role line than zoo's default renders
    assert (
        record["prompt_tokens"] == len(expected_ids) == len(encode_prompt(messages, tokenizer)) + 2
    )

    assert main(["eval", str(run), "--data", f"json:{chats}", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    config = zoo.data.ChatDataConfig(template=TEMPLATE, max_len=32, batch_size=64)
    expected = chat_evaluation(zoo.data.load_spec(f"json:{chats}"), tokenizer,
                                        config=config)  # fmt: skip
    assert found["total_tokens"] == expected.tokens  # the run's template, not zoo's default
    default = chat_evaluation(zoo.data.load_spec(f"json:{chats}"), tokenizer,
                                       config=zoo.data.ChatDataConfig(max_len=32))  # fmt: skip
    assert found["total_tokens"] == default.tokens + 8 * 2  # two role lines per conversation


def test_zoo_chat_warns_in_one_line_when_the_tokenizer_has_no_template(tmp_path, capsys):
    tokenizer = zoo.data.build_tokenizer("char", ["user: hello\nassistant: hi"])
    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id)  # fmt: skip
    folder = zoo.save(model, tmp_path / "plain", tokenizer=tokenizer)
    assert main(["chat", str(folder), "--message", "hello", "--max-new-tokens", "2",
                 "--json"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "chat template" in line]
    assert lines == [
        "zoo chat: warning: the char tokenizer has no chat template; using zoo's default "
        "('role:' line, content, eos per turn); pass --template FILE to choose one"
    ]
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    assert main(["chat", str(folder), "--message", "hello", "--max-new-tokens", "2",
                 "--template", str(tmp_path / "t.jinja"), "--json"]) == 0  # fmt: skip
    assert "chat template" not in capsys.readouterr().err


def test_a_missing_or_empty_template_file_is_refused_naming_the_flag(chats, tmp_path, capsys):
    base = ["train", "gpt", "--data", f"json:{chats}", "--out", str(tmp_path / "r"), *TRAIN]
    assert main([*base, "--template", str(tmp_path / "none.jinja")]) == 2
    assert f"--template {tmp_path / 'none.jinja'}: no such file" in capsys.readouterr().err
    (tmp_path / "empty.jinja").write_text("  \n", encoding="utf-8")
    assert main([*base, "--template", str(tmp_path / "empty.jinja")]) == 2
    assert f"--template {tmp_path / 'empty.jinja'} is empty" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_python_run_saves_its_chat_template(chats, tmp_path):
    config = zoo.data.ChatDataConfig(template=TEMPLATE, max_len=32, batch_size=4)
    data = zoo.data.chat_data(zoo.data.load_spec(f"json:{chats}"), tokenizer="word",
                              config=config)  # fmt: skip
    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=data.tokenizer.vocab_size,
                       pad_id=data.tokenizer.pad_id, eos_id=data.tokenizer.eos_id,
                       max_positions=32)  # fmt: skip
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-3),
                          loop=zoo.train.LoopSettings(progress=False))  # fmt: skip
    outputs = zoo.train.Outputs(out_dir=tmp_path / "py", tokenizer=data.tokenizer,
                                chat_template=data.template)  # fmt: skip
    trainer.fit(model, data.train, steps=1, key=jax.random.key(1), outputs=outputs)
    assert (tmp_path / "py" / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    with pytest.raises(ValueError, match="chat_template must be Jinja text"):
        zoo.train.Outputs(out_dir=tmp_path / "x", chat_template=3)
