"""Control characters from data are shown escaped, never obeyed by the terminal."""

from __future__ import annotations

import json

import pytest

from zoo.text import printable, printable_json

HOSTILE = "a\x1b[2Jb\x07c\x08d\re\x7ff\x9bg\u202eh\u2066i\u2069j\u200ek\u200fl\u061cm\x00n"
ESCAPED = (
    "a\\x1b[2Jb\\x07c\\x08d\\re\\x7ff\\x9bg\\u202eh\\u2066i\\u2069j\\u200ek\\u200fl\\u061cm\\x00n"
)


def test_controls_are_written_as_their_escapes():
    assert printable(HOSTILE) == ESCAPED
    assert printable(HOSTILE) == repr(HOSTILE)[1:-1]  # Python's own escapes for each


def test_newlines_and_tabs_stay_where_the_layout_keeps_them():
    assert printable("one\n\ttwo\r\n") == "one\n\ttwo\\r\n"
    assert printable("one\n\ttwo", multiline=False) == "one\\n\ttwo"


@pytest.mark.parametrize("text", ["plain words", "héllo wörld 日本語 😀 ←→ ‑", "\u00a0\u200b"])
def test_other_text_is_left_as_it_is(text):
    assert printable(text) == text


def test_json_lines_keep_their_meaning():
    line = json.dumps({"reply": HOSTILE, "é": "\u202e"}, ensure_ascii=False)
    safe = printable_json(line)
    assert json.loads(safe) == {"reply": HOSTILE, "é": "\u202e"}
    assert safe.isprintable() and "é" in safe


def test_indented_json_keeps_its_layout():
    text = json.dumps({"a": ["\u202e\x9b"]}, ensure_ascii=False, indent=2)
    assert printable_json(text) == '{\n  "a": [\n    "\\u202e\\u009b"\n  ]\n}'
