"""Chat templates are untrusted: each bound on rendering (time, output size, range items, `*`
and size arguments, recursion) refuses a hostile template in one line that names it, quickly
and without a traceback from jinja2; templates that need other files are refused by name."""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest

from zoo.data.chat import template as template_module
from zoo.data.chat.template import DEFAULT_TEMPLATE, LIMITS, ChatTemplate

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]


def refusal(source: str, origin: str = "chat_template.jinja") -> str:
    started = time.monotonic()
    with pytest.raises(ValueError) as error:
        ChatTemplate(source, origin=origin).render(HI)
    assert time.monotonic() - started < LIMITS.seconds + 5
    message = str(error.value)
    assert message.startswith(origin) and "\n" not in message
    # no chained traceback: nothing from jinja2 is shown beneath the one line
    assert error.value.__cause__ is None
    assert error.value.__context__ is None or error.value.__suppress_context__
    return message


def test_a_range_past_the_budget_is_refused():
    assert "range() calls produce more than 1,000,000 items" in refusal(
        "{% for i in range(10**9) %}{% endfor %}"
    )
    # nested loops add up: 2,000 x 1,000 items, each range small
    assert "more than 1,000,000 items" in refusal(
        "{% for i in range(2000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
    )
    # within the budget a range works as Python's does (length, slicing, reversing)
    text = "{{ range(3)|list }} {{ range(5)|length }} {{ range(4)[1:3]|list }} {{ range(3)|reverse|list }}"
    assert ChatTemplate(text).render(HI) == "[0, 1, 2] 5 [1, 2] [2, 1, 0]"


def test_building_a_huge_string_or_list_is_refused_before_it_is_built():
    assert "builds a str of 10,000,000,000 items with '*'" in refusal("{{ 'x' * 10**10 }}")
    assert "builds a list of" in refusal("{{ (messages * 10**9)|length }}")
    assert "raises a number to the power 100000" in refusal("{{ 2 ** 100000 }}")
    assert "its center filter is given a size over 16,000,000" in refusal(
        "{{ 'x'|center(10**10) }}"
    )
    assert "calls ljust with a size over 16,000,000" in refusal("{{ 'x'.ljust(10**10) }}")


def test_output_past_the_size_limit_is_refused(monkeypatch):
    small = dataclasses.replace(LIMITS, characters=1000)
    monkeypatch.setattr(template_module, "LIMITS", small)
    assert "renders more than 1,000 characters" in refusal(
        "{% for i in range(2000) %}{{ 'ab' }}{% endfor %}"
    )
    assert ChatTemplate("{% for i in range(500) %}{{ 'ab' }}{% endfor %}").render(HI) == "ab" * 500


def test_a_rendering_past_the_time_limit_is_refused(monkeypatch):
    monkeypatch.setattr(template_module, "LIMITS", dataclasses.replace(LIMITS, seconds=0.2))
    # 900 x 1,000 loop passes that write nothing: within the range budget, never done in 0.2 s
    slow = (
        "{% for i in range(900) %}{% for j in range(1000) %}{{ ''.strip() }}{% endfor %}"
        "{% endfor %}"
    )
    assert "ran past the 0.2 s time limit" in refusal(slow)


def test_a_macro_that_calls_itself_is_refused():
    source = "{% macro again(n) %}{{ again(n + 1) }}{% endmacro %}{{ again(0) }}"
    assert "nests calls too deeply" in refusal(source)


def test_the_templates_own_errors_are_one_line_naming_it():
    assert "failed while rendering: TypeError" in refusal("{{ messages[0]['content'] + 1 }}")


@pytest.mark.parametrize(
    ("source", "tag"),
    [
        ("{% include 'other.jinja' %}", "include"),
        ("{% import 'macros.jinja' as m %}", "import"),
        ("{% from 'macros.jinja' import m %}", "from ... import"),
        ("{% extends 'base.jinja' %}", "extends"),
    ],
)
def test_templates_that_need_other_files_are_refused_by_name(source, tag):
    message = refusal(source, origin="folder/chat_template.jinja")
    assert f"uses {{% {tag} %}} (line 1)" in message and "write the included text" in message


@pytest.mark.parametrize("source", ["", "  \n"])
def test_an_empty_template_is_refused_as_empty(source):
    assert "chat_template.jinja is empty" in refusal(source)


def test_real_templates_render_as_before():
    text = ChatTemplate(DEFAULT_TEMPLATE, {"eos_token": "</s>"}).render(HI)
    assert text == "user:\nHi</s>\nassistant:\nYo</s>\n"


def test_a_template_file_that_is_not_utf8_is_named(tmp_path):
    from zoo.data.chat.files import read_chat_templates

    (tmp_path / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    with pytest.raises(ValueError) as error:
        read_chat_templates(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'chat_template.jinja'} is damaged (not UTF-8 text: byte 0xff at offset 14); "
        "save the template as UTF-8, or delete it to use the tokenizer's own"
    )


def test_a_template_past_the_length_bound_is_refused_before_it_is_parsed(monkeypatch, tmp_path):
    from zoo.data.chat import files

    for module in (template_module, files):
        monkeypatch.setattr(module, "MAX_TEMPLATE_CHARS", 40)
    source = "{{ messages[0]['content'] }}" + " " * 13  # 41 characters
    message = refusal(source, origin="long.jinja")
    assert message == (
        "long.jinja refused: it is 41 characters long, past zoo's bound of 40 for a chat "
        "template; a real one is far shorter, so check that it is the template you meant"
    )
    assert ChatTemplate(source[:-1], origin="long.jinja").render(HI) == "Hi" + " " * 12
    # a file is read no further than 4 bytes a character past the bound
    (tmp_path / "chat_template.jinja").write_text("x" * 161)
    with pytest.raises(
        ValueError, match=r"chat_template.jinja refused: it holds more than the 160"
    ):
        files.read_chat_templates(tmp_path)


@pytest.mark.parametrize(
    "source",
    [
        "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
        "{% if 1 %}" * 3000 + "x" + "{% endif %}" * 3000,
        "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    ],
)
def test_a_template_nested_too_deeply_to_parse_is_refused_not_a_recursion_error(source):
    message = refusal(source)
    assert message.startswith("chat_template.jinja refused: it nests expressions or blocks too")
