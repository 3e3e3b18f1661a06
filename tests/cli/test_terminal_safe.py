"""Control characters of data and replies reach the terminal escaped (`\\x1b`, `\\u202e`), never
raw: `--show-data` (conversations and preference pairs), the CLI's errors and warnings, a chat
template's refusals, `zoo eval`'s samples, and the model's text of `zoo chat` and `zoo generate`
(unless `--raw`)."""

from __future__ import annotations

import importlib.util
import io
import json
import string
import warnings

import jax
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import eval as eval_command
from zoo.cli import main
from zoo.cli import presets as presets_command
from zoo.data import CharTokenizer
from zoo.decoding import chat as chat_decoding
from zoo.decoding import text as text_decoding

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
CLEAR, REVERSE = "\x1b[2J", "\u202e"  # clear the screen; show the rest right to left
SHOW = ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "char", "--batch-size", "1"]


def raw_controls(text: str) -> list[str]:
    """The control characters in `text` a terminal would obey (newlines and tabs aside)."""
    return [c for c in text if (not c.isprintable() and c not in "\n\t")]


def test_show_data_escapes_the_controls_of_conversations(tmp_path, capsys):
    chat = [{"role": "user", "content": f"hi{CLEAR}"},
            {"role": "assistant", "content": f"yo{REVERSE}\r\x07"}]  # fmt: skip
    write_jsonl(tmp_path / "chats", "train", [{"messages": chat}] * 3)
    assert main([*SHOW, "--data", f"json:{tmp_path / 'chats'}", "--show-data", "1"]) == 0
    out = capsys.readouterr().out
    assert raw_controls(out) == []  # before: ESC, U+202E, CR and BEL went out raw
    assert "user:\nhi\\x1b[2J<eos>\nassistant:\n[[yo\\u202e\\r\\x07<eos>]]\n" in out


def test_show_data_shows_preference_pairs(tmp_path, capsys):
    rows = [{"prompt": "2+2=", "chosen": f"4{CLEAR}", "rejected": f"5{REVERSE}"},
            {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
            {"prompt": "3+1=", "chosen": "4", "rejected": "9"}]  # fmt: skip
    write_jsonl(tmp_path / "pairs", "train", rows)
    write_jsonl(tmp_path / "pairs", "validation", rows[1:])
    status = main([*SHOW, "--data", f"json:{tmp_path / 'pairs'}", "--show-data", "2",
                   "--objective", "dpo"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0  # before: "--show-data shows chat data ... fit no chat format"
    assert out == (
        "--- pair 0: prompt ---\n<bos>2+2=\n"
        "--- pair 0: chosen ---\n[[4\\x1b[2J<eos>]]\n"
        "--- pair 0: rejected ---\n[[5\\u202e<eos>]]\n"
        "--- pair 1: prompt ---\n<bos>1+1=\n"
        "--- pair 1: chosen ---\n[[2<eos>]]\n"
        "--- pair 1: rejected ---\n[[3<eos>]]\n"
        "--- legend: [[marked]] text is scored (each answer's tokens after the prompt); "
        "standard format, no template (text rows) ---\n"
        "pairs: train: 3, validation: 2\n"
        # bos + prompt + answer + eos: 5 + 5 + 1, 5 + 1 + 1 (twice each), 5 + 1 + 1 (twice)
        "lengths in tokens (prompt + answer, as trained): p50 7, p90 10, p99 11, max 11\n"
    )


def test_show_data_marks_the_answers_of_conversational_pairs(tmp_path, capsys):
    def turn(role, content):
        return [{"role": role, "content": content}]

    rows = [{"prompt": turn("user", "hi"), "chosen": turn("assistant", "yo"),
             "rejected": turn("assistant", "no")}] * 3  # fmt: skip
    write_jsonl(tmp_path / "pairs", "train", rows)
    assert main([*SHOW, "--data", f"json:{tmp_path / 'pairs'}", "--show-data", "1"]) == 0
    out = capsys.readouterr().out
    # zoo's default template: the prompt ends with the assistant's header, and every token
    # after it (the reply, its end of turn and the line after) is scored
    assert out.startswith(
        "--- pair 0: prompt ---\n<bos>user:\nhi<eos>\nassistant:\n\n"
        "--- pair 0: chosen ---\n[[yo<eos>\n]]\n"
        "--- pair 0: rejected ---\n[[no<eos>\n]]\n"
        "--- legend: [[marked]] text is scored (each answer's tokens after the prompt); "
        "conversational format, zoo's default chat template ---\n"
    )


def test_a_template_refusal_quoting_the_data_is_escaped(tmp_path, capsys):
    template = tmp_path / "strict.jinja"
    template.write_text("{{ raise_exception('unknown text: ' + messages[0]['content']) }}")
    chat = [{"role": "user", "content": f"hi{CLEAR}{REVERSE}"},
            {"role": "assistant", "content": "yo"}]  # fmt: skip
    write_jsonl(tmp_path / "chats", "train", [{"messages": chat}] * 2)
    status = main([*SHOW, "--data", f"json:{tmp_path / 'chats'}", "--show-data", "1",
                   "--template", str(template)])  # fmt: skip
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert status == 2 and raw_controls(error) == []  # (datasets' progress bars aside)
    assert error.endswith("unknown text: hi\\x1b[2J\\u202e (roles: ['user', 'assistant'])")
    from zoo.data.chat.template import ChatTemplate  # the refusal itself, for Python users

    with pytest.raises(ValueError, match=r"unknown text: hi\\x1b\[2J\\u202e") as refused:
        ChatTemplate(template.read_text()).render(chat)
    assert raw_controls(str(refused.value)) == []


@pytest.mark.parametrize("error", [ValueError, KeyError])
def test_errors_and_warnings_quoting_data_are_escaped(error, monkeypatch, capsys):
    def refuse(args):
        warnings.warn(f"odd row {CLEAR}", UserWarning, stacklevel=1)
        raise error(f"row 3 holds {REVERSE}olleh\r")

    monkeypatch.setattr(presets_command, "run", refuse)
    assert main(["presets"]) == 2
    assert capsys.readouterr().err == (
        "zoo presets: warning: odd row \\x1b[2J\nzoo presets: error: row 3 holds \\u202eolleh\\r\n"
    )


def test_eval_prints_its_samples_escaped(tmp_path, monkeypatch, capsys):
    sample = {"source": f"hund{CLEAR}", "hypothesis": f"dog{REVERSE}\nfake line",
              "reference": "dog\x07"}  # fmt: skip
    result = {"bleu": 12.5, "split": f"test{REVERSE}", "samples": [sample]}
    monkeypatch.setattr(eval_command, "evaluate", lambda args: result)
    assert main(["eval", str(tmp_path), "--data", f"json:{tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out == (
        "            bleu: 12.5\n"
        "           split: test\\u202e\n"
        "  hund\\x1b[2J\n    -> dog\\u202e\\nfake line\n    == dog\\x07\n"
    )


TOKENIZER = CharTokenizer(string.ascii_lowercase + " :\n")
HOSTILE_REPLY = ["ok", CLEAR, f"{REVERSE}ih", "\x1b]0;owned\x07"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    model = zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size)
    return str(zoo.save(model, tmp_path_factory.mktemp("chat-model"), tokenizer=TOKENIZER))


@pytest.fixture
def hostile_model(monkeypatch):
    """`zoo chat`'s model streams a reply of control sequences."""

    def reply(model, chat_format, messages, *, on_text=None, **options):
        for piece in HOSTILE_REPLY:
            if on_text is not None:
                on_text(piece)
        text = "".join(HOSTILE_REPLY)
        return chat_decoding.Reply(text, (1, 2, 3), "stop", 7)

    monkeypatch.setattr(chat_decoding, "reply", reply)


def test_chat_replies_are_escaped_unless_raw(chat_model, hostile_model, monkeypatch, capsys):
    assert main(["chat", chat_model, "--message", "hi"]) == 0
    out = capsys.readouterr().out
    assert out == "ok\\x1b[2J\\u202eih\\x1b]0;owned\\x07\n"  # before: the sequences, raw
    assert main(["chat", chat_model, "--message", "hi", "--raw"]) == 0
    assert capsys.readouterr().out == "".join(HOSTILE_REPLY) + "\n"
    assert main(["chat", chat_model, "--message", "hi", "--json"]) == 0
    line = capsys.readouterr().out
    assert raw_controls(line) == [] and "\\u202e" in line
    assert json.loads(line)["reply"] == "".join(HOSTILE_REPLY)  # the same JSON to a parser


def test_chat_history_keeps_the_reply_as_written(chat_model, hostile_model, monkeypatch, capsys):
    seen = []
    real = chat_decoding.reply

    def recording(model, chat_format, messages, **options):
        seen.append(list(messages))
        return real(model, chat_format, messages, **options)

    monkeypatch.setattr(chat_decoding, "reply", recording)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nagain\n"))
    assert main(["chat", chat_model]) == 0
    assert seen[1][1] == {"role": "assistant", "content": "".join(HOSTILE_REPLY)}


def test_generate_prints_the_output_escaped_unless_raw(chat_model, monkeypatch, capsys):
    monkeypatch.setattr(text_decoding, "generate_texts",
                        lambda model, tokenizer, prompts, **options: ["".join(HOSTILE_REPLY)])  # fmt: skip
    assert main(["generate", chat_model, "--prompt", "hi "]) == 0
    assert capsys.readouterr().out == "hi ok\\x1b[2J\\u202eih\\x1b]0;owned\\x07\n"
    assert main(["generate", chat_model, "--prompt", "hi ", "--raw"]) == 0
    assert capsys.readouterr().out == "hi " + "".join(HOSTILE_REPLY) + "\n"
    assert main(["generate", chat_model, "--prompt", "hi ", "--json"]) == 0
    line = capsys.readouterr().out
    assert raw_controls(line) == [] and json.loads(line)["output"] == "".join(HOSTILE_REPLY)
