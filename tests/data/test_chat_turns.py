"""Assistant turns read from the whole rendering (zoo.data.chat.turns), on small templates shaped
like the real ones that broke reading a turn from the conversation ending with it: one that
writes eos only at the very end (Phi-3), one that writes its end marker after every message but
the last (Qwen1.5). Ids and masks by hand on a char tokenizer; the real templates against
transformers are in test_chat_turns_hf.py."""

from __future__ import annotations

import importlib.util

import pytest

from zoo.data import CharTokenizer, DataError
from zoo.data.chat.batches import encode_conversations
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat
from zoo.data.chat.turns import turn_spans

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
# ids 0-3 are <pad> <bos> <eos> <unk>; then the characters in sorted order
CHARS = ">HYaiou|"
GT, H, Y, A, I_, O_, U, BAR = range(4, 4 + len(CHARS))
EOS = 2
TOKENIZER = CharTokenizer(CHARS)
TWO_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Yo"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Yo"},
]
# Phi-3's shape: "|" ends every turn, eos closes a conversation that ends without a prompt.
EOS_AT_THE_END = ChatTemplate(
    "{% for m in messages %}{{ m.role[0] }}>{{ m.content }}|{% endfor %}"
    "{% if add_generation_prompt %}a>{% else %}{{ eos_token }}{% endif %}",
    {"eos_token": "<eos>"},
    origin="eos-at-the-end.jinja",
)
# Qwen1.5's shape: the end marker after every message but the last (unless prompting).
MARKER_BUT_LAST = ChatTemplate(
    "{% for m in messages %}{{ m.role[0] }}>{{ m.content }}"
    "{% if not loop.last or add_generation_prompt %}<eos>{% endif %}{% endfor %}"
    "{% if add_generation_prompt and messages[-1].role != 'assistant' %}a>{% endif %}",
    origin="marker-but-last.jinja",
)


def test_a_template_that_closes_the_conversation_with_eos():
    chat = encode_chat(TWO_TURNS, TOKENIZER, template=EOS_AT_THE_END)
    assert chat.text == "u>Hi|a>Yo|u>Hi|a>Yo|<eos>"
    turn = [U, GT, H, I_, BAR, A, GT, Y, O_, BAR]
    assert chat.input_ids.tolist() == [*turn, *turn, EOS]
    # each reply and its "|"; the last one also the eos the model stops on
    reply = [0] * 7 + [1, 1, 1]
    assert chat.assistant_mask.tolist() == [*reply, *reply, 1]


def test_a_template_that_leaves_the_last_end_marker_out():
    chat = encode_chat(TWO_TURNS, TOKENIZER, template=MARKER_BUT_LAST)
    # the last reply gets the <eos> the template writes after a reply when the chat goes on
    assert chat.text == "u>Hi<eos>a>Yo<eos>u>Hi<eos>a>Yo<eos>"
    turn = [U, GT, H, I_, EOS, A, GT, Y, O_, EOS]
    assert chat.input_ids.tolist() == [*turn, *turn]
    reply = [0] * 7 + [1, 1, 1]
    assert chat.assistant_mask.tolist() == [*reply, *reply]
    # a conversation ending with a user turn is the template's own text
    asked = encode_chat(TWO_TURNS[:3], TOKENIZER, template=MARKER_BUT_LAST)
    assert asked.text == "u>Hi<eos>a>Yo<eos>u>Hi"
    assert asked.assistant_mask.tolist() == [0] * 7 + [1, 1, 1] + [0] * 4


def test_spans_reach_the_end_marker_only_through_whole_tokens():
    text, spans = turn_spans(EOS_AT_THE_END, TWO_TURNS, stop_texts=["<eos>"])
    # turn 1 as the last message ends "|<eos>", in the conversation "|u>": they part after "|"
    assert [(span.start, span.soft_end) for span in spans] == [(7, 10), (17, len(text))]
    text, spans = turn_spans(MARKER_BUT_LAST, TWO_TURNS, stop_texts=["<eos>"])
    assert text[spans[0].start : spans[0].soft_end] == "Yo<eos>"


def test_a_template_that_cannot_be_read_is_refused_naming_it_and_the_fixes():
    # the separator before a turn depends on the turn's role: the prompt is no prefix
    moving = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'assistant' %}#{% endif %}{{ m.content }}"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}",
        origin="moving.jinja",
    )
    with pytest.raises(ValueError) as refused:
        encode_chat(TWO_TURNS[:2], CharTokenizer("HiYo#>"), template=moving)
    message = str(refused.value)
    assert message.startswith("moving.jinja cannot be read turn by turn")
    assert "{% generation %}" in message and "(--train-on all, train_on='all')" in message
    # training on every token needs no turns
    every = encode_conversations([TWO_TURNS[:2]], CharTokenizer("HiYo#>"), template=moving,
                                 train_on="all")  # fmt: skip
    assert every.loss_mask.row(0).tolist() == [1] * 5
    dropping = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}|{% else %}ok|"
        "{% endif %}{% endfor %}",
        origin="dropping.jinja",
    )
    with pytest.raises(ValueError, match="content of assistant turn 1 is not where the turn"):
        encode_chat(TWO_TURNS[:2], CharTokenizer("HiYok|"), template=dropping)


def test_an_assistant_opener_is_read_the_same_by_encode_chat_and_the_batches():
    opener = [{"role": "assistant", "content": "Yo"}, *TWO_TURNS[:2]]
    chat = encode_chat(opener, TOKENIZER, template=EOS_AT_THE_END)
    examples = encode_conversations([opener], TOKENIZER, template=EOS_AT_THE_END)
    assert examples.loss_mask.row(0).tolist() == chat.assistant_mask.tolist()
    assert chat.assistant_mask[:5].tolist() == [0, 0, 1, 1, 1]  # "a>", then the greeting "Yo|"
    refusing = ChatTemplate(
        "{% if not messages %}{{ raise_exception('no messages') }}{% endif %}"
        + EOS_AT_THE_END.source,
        {"eos_token": "<eos>"},
        origin="refusing.jinja",
    )
    for encode in (encode_chat, lambda *a, **k: encode_conversations([a[0]], *a[1:], **k)):
        with pytest.raises(DataError, match="opens with an assistant turn, and refusing.jinja"):
            encode(opener, TOKENIZER, template=refusing)
