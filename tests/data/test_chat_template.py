"""Chat templates without transformers: the Jinja environment, generation spans, where templates
are read from, zoo's default template on a char tokenizer (ids by hand), and the assistant mask
read from renderings of a conversation's prefixes. The parity with transformers on real
templates is in test_chat_template_hf.py.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys

import pytest

from zoo.data import CharTokenizer
from zoo.data.chat.files import chat_template_for, pick_template, read_chat_templates
from zoo.data.chat.template import DEFAULT_TEMPLATE, ChatTemplate, _jinja
from zoo.data.chat.tokens import encode_chat, encode_prompt, span_mask, tokenize_text
from zoo.data.errors import DataError

needs_jinja = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
# ids 0-3 are <pad> <bos> <eos> <unk>; the characters follow in sorted order from 4
CHARS = "\n:HYaeinorstu"
NL, COLON, H, Y, A, E, I_, N, O_, R, S, T, U = range(4, 4 + len(CHARS))
BOS, EOS = 1, 2
USER = [U, S, E, R, COLON, NL]
ASSISTANT = [A, S, S, I_, S, T, A, N, T, COLON, NL]


@needs_jinja
def test_default_template_on_a_char_tokenizer_by_hand(caplog):
    tokenizer = CharTokenizer(CHARS)
    with caplog.at_level(logging.INFO, logger="zoo.data.chat.files"):
        chat = encode_chat(HI, tokenizer)
    assert "has no chat template: using zoo's default" in caplog.text
    assert chat.text == "<bos>user:\nHi<eos>\nassistant:\nYo<eos>\n"
    # <bos>, "user:\n", "Hi", <eos>, "\n", "assistant:\n", "Yo", <eos>, "\n"
    assert chat.input_ids.tolist() == [BOS, *USER, H, I_, EOS, NL, *ASSISTANT, Y, O_, EOS, NL]
    # the assistant's content and its eos; not the role line, not the newline after the eos
    assert chat.assistant_mask.tolist() == [0] * 22 + [1, 1, 1, 0]
    prompt = encode_prompt(HI[:1], tokenizer)
    assert prompt.tolist() == [BOS, *USER, H, I_, EOS, NL, *ASSISTANT]


@needs_jinja
def test_default_template_prompts_are_prefixes_of_the_conversation(gpt2):
    # what generation continues from is what training saw before each reply
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green, of course."},
    ]
    for tokenizer in (gpt2, CharTokenizer.from_corpus([json.dumps(messages)])):
        chat = encode_chat(messages, tokenizer)
        assert chat.input_ids[0] == tokenizer.bos_id
        for turn in (2, 4):
            prompt = encode_prompt(messages[:turn], tokenizer)
            assert chat.input_ids[: len(prompt)].tolist() == prompt.tolist()
            reply = tokenizer.encode(messages[turn]["content"], add_eos=True)
            end = len(prompt) + len(reply)
            assert chat.input_ids[len(prompt) : end].tolist() == reply
            assert chat.assistant_mask[len(prompt) : end].tolist() == [1] * len(reply)
        assert chat.assistant_mask.sum() == sum(
            len(tokenizer.encode(m["content"], add_eos=True)) for m in messages[2::2]
        )


@needs_jinja
def test_the_environment_is_transformers_own():
    text = (
        "{% for message in messages %}\n"
        "    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "    {{ message.content | tojson }}{{ eos_token }}\n"
        "{% endfor %}"
    )
    rendered = ChatTemplate(text, {"eos_token": "</s>"}).render(
        [{"content": "é"}, {"content": "x"}]
    )
    assert rendered == '    "é"</s>\n'  # trim_blocks, lstrip_blocks, loop controls, plain JSON
    assert ChatTemplate("{{ tojson(1) if false else strftime_now('%Y')|length }}").render([]) == "4"
    with pytest.raises(ValueError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render(HI)
    with pytest.raises(ValueError, match="not a valid Jinja template"):
        ChatTemplate("{% for %}").render(HI)
    # the sandbox refuses attribute access into Python internals
    with pytest.raises(ValueError, match="unsafe"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render(HI)


@needs_jinja
def test_generation_blocks_give_character_spans():
    text = (
        "{% for m in messages %}{{ m.role }}: "
        "{% if m.role == 'assistant' %}{% generation %}{{ m.content }};{% endgeneration %}"
        "{% else %}{{ m.content }};{% endif %}{% endfor %}"
    )
    template = ChatTemplate(text)
    assert template.has_generation_blocks and not ChatTemplate("{{ 1 }}").has_generation_blocks
    rendered, spans = template.spans([*HI, {"role": "user", "content": "Q"}, HI[1]])
    assert rendered == "user: Hi;assistant: Yo;user: Q;assistant: Yo;"
    assert [rendered[start:end] for start, end in spans] == ["Yo;", "Yo;"]
    assert template.render(HI) == "user: Hi;assistant: Yo;"  # no marks outside `spans`
    nested = "{% generation %}a{% generation %}b{% endgeneration %}{% endgeneration %}"
    with pytest.raises(ValueError, match="nested"):
        ChatTemplate(nested).spans(HI)


@needs_jinja
def test_a_template_without_an_end_of_turn_token_masks_the_whole_turn():
    template = ChatTemplate(
        "{% for m in messages %}{{ m.role[0] }}>{{ m.content }}|{% endfor %}"
        "{% if add_generation_prompt %}a>{% endif %}"
    )
    chat = encode_chat(HI, CharTokenizer("a>|uHiYo"), template=template)
    assert chat.text == "u>Hi|a>Yo|"
    assert chat.assistant_mask.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]


@needs_jinja
def test_a_template_that_rewrites_earlier_turns_is_refused():
    # the separator depends on what follows, so a turn's text changes when the next is added
    template = ChatTemplate(
        "{% for m in messages %}{{ m.content }}{% if not loop.last %}|{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    with pytest.raises(ValueError, match=r"\{% generation %\}"):
        encode_chat(HI, CharTokenizer("HiYo|>"), template=template)


@needs_jinja
def test_a_conversation_may_open_with_an_assistant_turn():
    plain = ChatTemplate("{% for m in messages %}{{ m.content }}|{% endfor %}")
    chat = encode_chat(HI[::-1], CharTokenizer("HiYo|>"), template=plain)
    assert chat.text == "Yo|Hi|"
    assert chat.assistant_mask.tolist() == [1, 1, 1, 0, 0, 0]
    # a template that cannot write the empty conversation before the greeting is named
    strict = ChatTemplate(
        "{% if not messages %}{{ raise_exception('no messages') }}{% endif %}" + plain.source,
        origin="strict.jinja",
    )
    with pytest.raises(DataError, match="opens with an assistant turn, and strict.jinja"):
        encode_chat(HI[::-1], CharTokenizer("HiYo|>"), template=strict)


def test_pieces_cut_at_special_strings_and_boundaries():
    tokenizer = CharTokenizer("ab")
    ids, offsets = tokenize_text(tokenizer, "ab<eos>ba", cuts=[1, 8])
    assert ids == [4, 5, EOS, 5, 4]
    assert offsets == [(0, 1), (1, 2), (2, 7), (7, 8), (8, 9)]  # a token has its piece's span
    mask = span_mask(ids, offsets, [(1, 8)], stop_ids={EOS})
    assert mask == [0, 1, 1, 0, 0]  # the span stops at its first stop token
    assert span_mask(ids, offsets, [(1, 8)]) == [0, 1, 1, 1, 0]


def test_templates_are_read_from_the_files_of_a_snapshot(tmp_path):
    config = {"eos_token": "</s>", "chat_template": "from the config"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_chat_templates(tmp_path) == "from the config"
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": named}))
    assert read_chat_templates(tmp_path) == {"default": "D", "tool_use": "T"}
    (tmp_path / "chat_template.jinja").write_text("from the jinja file")
    assert read_chat_templates(tmp_path) == "from the jinja file"
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("R")
    assert read_chat_templates(tmp_path) == {"default": "from the jinja file", "rag": "R"}
    assert read_chat_templates(tmp_path / "additional_chat_templates") is None


def test_a_template_is_picked_out_of_named_ones():
    named = {"default": "D", "tool_use": "T", "rag": "R"}
    assert pick_template(named) == "D"
    assert pick_template(named, tools=True) == "T"
    assert pick_template(named, name="rag") == "R"
    assert pick_template("S") == "S"
    with pytest.raises(ValueError, match="no chat template named 'chat'"):
        pick_template(named, name="chat")
    with pytest.raises(
        ValueError, match=r"templates, \['rag', 'tool_use'\], and none called 'default'"
    ):
        pick_template({"tool_use": "T", "rag": "R"})


def test_the_template_a_tokenizer_gets(tmp_path):
    tokenizer = CharTokenizer("ab")
    default = chat_template_for(tokenizer)
    assert default.source == DEFAULT_TEMPLATE
    assert default.special_tokens == {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    (tmp_path / "chat_template.jinja").write_text("{{ eos_token }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    from_folder = chat_template_for(tokenizer, folder=tmp_path)
    assert (from_folder.source, from_folder.special_tokens) == (
        "{{ eos_token }}",
        {"eos_token": "</s>"},
    )
    assert chat_template_for(tokenizer, template="given").source == "given"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3}))
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="chat_template should be a template string"):
        chat_template_for(tokenizer, folder=tmp_path)


def test_without_jinja2_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)  # makes `import jinja2` fail
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[chat\]'"):
        _jinja()
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[chat\]'"):
        ChatTemplate(DEFAULT_TEMPLATE).render(HI)
