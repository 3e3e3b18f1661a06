"""`zoo chat`: one --message, lines on stdin with /reset and /exit, JSON and text output, the
system prompt, a template file and sampling flags, against `zoo.chat` in Python."""

from __future__ import annotations

import importlib.util
import io
import json
import string
import sys

import jax
import pytest

import zoo
from zoo.cli import main
from zoo.data import CharTokenizer
from zoo.decoding import SamplingSettings
from zoo.decoding.chat import ChatFormat, reply

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
TOKENIZER = CharTokenizer(string.ascii_lowercase + " :\n")
OPTIONS = ["--max-new-tokens", "6"]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    model = zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size)
    directory = tmp_path_factory.mktemp("chat-model")
    zoo.save(model, directory, tokenizer=TOKENIZER)
    return model, str(directory)


# the saved model's char tokenizer has no template: zoo chat says so once, first, then talks
DEFAULT_TEMPLATE_WARNING = (
    "zoo chat: warning: the char tokenizer has no chat template; using zoo's default "
)


def stderr_after_warning(err: str) -> str:
    """`err` without the default-template warning, which must be its first line, once."""
    first, _, rest = err.partition("\n")
    assert first.startswith(DEFAULT_TEMPLATE_WARNING), err
    assert DEFAULT_TEMPLATE_WARNING not in rest
    return rest


def run_with_stdin(monkeypatch, capsys, text: str, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    status = main(["chat", *args])
    captured = capsys.readouterr()
    return status, captured.out, stderr_after_warning(captured.err)


def test_one_message_prints_the_reply_as_json(chat_dir, capsys):
    model, directory = chat_dir
    assert main(["chat", directory, "--message", "hello", *OPTIONS, "--json"]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = reply(model, TOKENIZER, "hello", max_new_tokens=6)
    assert record == {
        "turn": 1,
        "user": "hello",
        "reply": expected.text,
        "finish_reason": expected.finish_reason,
        "new_tokens": len(expected.tokens),
        "prompt_tokens": expected.prompt_tokens,
    }


def test_stdin_lines_keep_the_history_until_reset_and_stop_at_exit(chat_dir, monkeypatch, capsys):
    model, directory = chat_dir
    lines = "hello\n\nagain\n/reset\nhello\n/exit\nnever answered\n"
    status, out, err = run_with_stdin(monkeypatch, capsys, lines, directory, *OPTIONS, "--json")
    assert status == 0
    first, second, third = [json.loads(line) for line in out.splitlines()]
    assert [first["turn"], second["turn"], third["turn"]] == [1, 2, 3]
    assert second["user"] == "again"
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first["reply"]},
        {"role": "user", "content": "again"},
    ]
    assert second["reply"] == reply(model, TOKENIZER, history, max_new_tokens=6).text
    assert second["prompt_tokens"] > first["prompt_tokens"]  # the history was kept
    # after /reset the same message gets the same prompt and the same (greedy) reply
    assert {**third, "turn": 1} == first
    assert "never" not in out and err == ""


def test_text_output_streams_each_reply_on_its_own_line(chat_dir, monkeypatch, capsys):
    model, directory = chat_dir
    status, out, err = run_with_stdin(monkeypatch, capsys, "hello\n/help\nbye\n", directory,
                                      *OPTIONS)  # fmt: skip
    assert status == 0
    first = reply(model, TOKENIZER, "hello", max_new_tokens=6).text
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first}]
    second = reply(model, TOKENIZER, [*history, {"role": "user", "content": "bye"}],
                   max_new_tokens=6).text  # fmt: skip
    assert out == f"{first}\n{second}\n"
    assert "unknown command '/help'; commands: /reset (start the conversation again)" in err


def test_system_prompt_template_file_and_sampling(chat_dir, tmp_path, capsys):
    model, directory = chat_dir
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    args = ["chat", directory, "--message", "hi", "--system", "be brief", *OPTIONS, "--json"]
    sampled = ["--temperature", "0.9", "--top-k", "5", "--seed", "4"]
    assert main([*args, "--template", str(template), *sampled]) == 0
    record = json.loads(capsys.readouterr().out)
    expected = reply(
        model, ChatFormat(TOKENIZER, template=template.read_text(), system="be brief"), "hi",
        max_new_tokens=6, sampling=SamplingSettings(0.9, top_k=5),
        key=jax.random.fold_in(jax.random.key(4), 0),
    )  # fmt: skip
    assert record["reply"] == expected.text
    assert record["prompt_tokens"] == len("system be brief\nuser hi\nassistant ")


def test_bad_requests_fail_before_loading_or_say_why(chat_dir, monkeypatch, capsys):
    _, directory = chat_dir
    with pytest.raises(SystemExit):  # refused by the flag's type, as argparse refuses
        main(["chat", directory, "--message", "hi", "--temperature", "-1"])
    assert "--temperature: -1 is not a finite number >= 0" in capsys.readouterr().err
    assert main(["chat", directory, "--message", "hi" * 80]) == 2
    assert "no room to answer" in capsys.readouterr().err
    # on stdin a turn that fails is reported and the chat goes on
    status, out, err = run_with_stdin(monkeypatch, capsys, "hi" * 80 + "\nhi\n", directory,
                                      *OPTIONS, "--json")  # fmt: skip
    assert status == 0 and "zoo chat: error: the prompt has" in err
    assert json.loads(out)["turn"] == 1


def test_at_a_terminal_it_prompts_streams_and_quits_on_ctrl_d(chat_dir, monkeypatch, capsys):
    model, directory = chat_dir
    typed = iter(["hello", "/reset"])

    def fake_input(prompt: str) -> str:
        print(prompt, end="", file=sys.stderr)
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdin", terminal)
    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["chat", directory, *OPTIONS]) == 0
    captured = capsys.readouterr()
    assert captured.out == reply(model, TOKENIZER, "hello", max_new_tokens=6).text + "\n"
    assert "/reset clears the history, /exit quits" in captured.err
    assert captured.err.count("> ") == 3 and "(history cleared)" in captured.err


def at_a_terminal(monkeypatch, typed: list[str]) -> None:
    """stdin a terminal whose lines are `typed`; a KeyboardInterrupt in it is a Ctrl-C."""
    lines = iter(typed)

    def fake_input(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        if isinstance(line, BaseException):
            raise line
        return line

    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdin", terminal)
    monkeypatch.setattr("builtins.input", fake_input)


def test_closed_and_empty_stdin(chat_dir, monkeypatch, capsys):
    _, directory = chat_dir
    # before: AttributeError: 'NoneType' object has no attribute 'isatty'
    monkeypatch.setattr("sys.stdin", None)
    assert main(["chat", directory, *OPTIONS]) == 2
    assert capsys.readouterr().err == (
        "zoo chat: error: standard input is closed, so there is nothing to answer: pass "
        "--message TEXT, pipe the messages in, or run zoo chat in a terminal\n"
    )
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr("sys.stdin", closed)
    assert main(["chat", directory, *OPTIONS]) == 2
    assert "standard input is closed" in capsys.readouterr().err
    # `< /dev/null`: nothing to answer, a quiet exit (as for a file of blank lines)
    assert run_with_stdin(monkeypatch, capsys, "", directory, *OPTIONS) == (0, "", "")
    # --message needs no standard input
    monkeypatch.setattr("sys.stdin", None)
    assert main(["chat", directory, "--message", "hi", *OPTIONS, "--json"]) == 0


def test_ctrl_c_while_streaming_stops_the_reply_and_returns_to_the_prompt(
    chat_dir, monkeypatch, capsys
):
    model, directory = chat_dir
    at_a_terminal(monkeypatch, ["hello", "again"])
    shown: list[str] = []

    def print_then_interrupt(piece: str) -> None:
        shown.append(piece)
        sys.stdout.write(piece)
        if len(shown) == 2:  # Ctrl-C after the first reply's second piece
            raise KeyboardInterrupt

    monkeypatch.setattr("zoo.cli.chat._print_piece", print_then_interrupt)
    assert main(["chat", directory, *OPTIONS]) == 0
    captured = capsys.readouterr()
    cut = "".join(shown[:2])
    assert reply(model, TOKENIZER, "hello", max_new_tokens=6).text.startswith(cut)
    # the history keeps what was shown of the cut reply
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": cut},
               {"role": "user", "content": "again"}]  # fmt: skip
    second = reply(model, TOKENIZER, history, max_new_tokens=6).text
    assert captured.out == f"{cut}\n{second}\n"
    assert "(reply stopped)\n" in captured.err and "Traceback" not in captured.err


def test_ctrl_c_at_the_prompt_quits_with_status_130(chat_dir, monkeypatch, capsys):
    _, directory = chat_dir
    at_a_terminal(monkeypatch, [KeyboardInterrupt()])  # type: ignore[list-item]
    # before: a KeyboardInterrupt traceback
    assert main(["chat", directory, *OPTIONS]) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert stderr_after_warning(captured.err) == (
        f"zoo chat: {directory}; /reset clears the history, /exit quits\n\n"
    )


def test_ctrl_c_with_message_stops_the_command(chat_dir, monkeypatch, capsys):
    _, directory = chat_dir

    def interrupt(piece: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("zoo.cli.chat._print_piece", interrupt)
    assert main(["chat", directory, "--message", "hello", *OPTIONS]) == 130
    assert stderr_after_warning(capsys.readouterr().err) == "zoo chat: interrupted\n"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--message", "--message is empty: give the text to send"),
        ("--system", "--system is empty: give the system prompt, or leave --system out"),
    ],
)
def test_empty_message_or_system_is_refused_naming_the_flag(chat_dir, capsys, flag, message):
    _, directory = chat_dir
    args = ["chat", directory, "--message", "hi", flag, " ", *OPTIONS]
    # before: "row 0, message 0 (user) has empty content; fill it or drop the row"
    assert main(args) == 2
    assert capsys.readouterr().err == f"zoo chat: error: {message}\n"


def test_a_prompt_the_tokenizer_cannot_spell_is_warned_about_once(chat_dir, monkeypatch, capsys):
    _, directory = chat_dir
    # the default template spells "user:\n" and "assistant:\n"; HELLO is 5 unknown characters
    status, out, err = run_with_stdin(monkeypatch, capsys, "HELLO\nHELLO\n", directory,
                                      *OPTIONS, "--json")  # fmt: skip
    assert status == 0 and len(out.splitlines()) == 2
    assert err == (
        "zoo chat: warning: 5 of 25 prompt tokens are unknown to this model's char tokenizer "
        "(<unk>): it was trained on other text, so the reply means little\n"
    )
    status, _, err = run_with_stdin(monkeypatch, capsys, "hello\n", directory, *OPTIONS, "--json")
    assert (status, err) == (0, "")
