"""Hostile chat data that used to be silently wrong (issue 29): per-message weights, a special
token's text written in a message's content, and a template that ignores
`add_generation_prompt`. Ids by hand on char and word tokenizers, and on a tokenizer.json laid out
like Qwen2.5's (chat_folders.py)."""

from __future__ import annotations

import importlib.util

import datasets
import numpy as np
import pytest

from zoo.data import CharTokenizer, DataError
from zoo.data.chat.batches import encode_conversations
from zoo.data.chat.conversations import conversation_messages
from zoo.data.chat.datasets import chat_data
from zoo.data.chat.options import ChatDataConfig
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import content_defused, encode_chat, encode_prompt, tokenize_text

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
# ids 0-3 are <pad> <bos> <eos> <unk>; the characters follow in sorted order from 4
CHARS = "\n:<>HYadeinoprstu"
NL, COLON, LT, GT, H, Y, A, D, E, I_, N, O_, P, R, S, T, U = range(4, 4 + len(CHARS))
PAD, BOS, EOS = 0, 1, 2
USER = [U, S, E, R, COLON, NL]
ASSISTANT = [A, S, S, I_, S, T, A, N, T, COLON, NL]
TOKENIZER = CharTokenizer(CHARS)
HI, YO = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}
# <bos> user:\n Hi <eos> \n assistant:\n Yo <eos> \n: 26 ids, "Yo<eos>" at 22-24
TURNS = [BOS, *USER, H, I_, EOS, NL, *ASSISTANT, Y, O_, EOS, NL]
# the same without the bos: the second exchange of a conversation
MORE = TURNS[1:]
# no generation blocks: each turn's span is read from renderings of the prefixes
PLAIN = ChatTemplate(
    "{% for m in messages %}{{ m.role[0] }}>{{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}a>{% endif %}",
    {"eos_token": "<eos>"},
)
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_a_weight_0_turn_is_written_but_not_trained():
    messages = conversation_messages({"messages": [HI, {**YO, "weight": 0}, HI, YO]})
    assert messages[1] == {"role": "assistant", "content": "Yo", "weight": 0}
    chat = encode_chat(messages, TOKENIZER)  # zoo's default template: generation blocks
    assert chat.input_ids.tolist() == TURNS + MORE
    assert chat.assistant_mask.tolist() == [0] * 47 + [1, 1, 1, 0]  # the second "Yo<eos>" only
    every = encode_chat([HI, YO, HI, YO], TOKENIZER)
    assert every.input_ids.tolist() == TURNS + MORE
    assert every.assistant_mask.tolist() == [0] * 22 + [1, 1, 1] + [0] * 22 + [1, 1, 1, 0]
    # axolotl's flag is the same mark; and without generation blocks
    flagged = [HI, {**YO, "train": False}, HI, YO]
    chat = encode_chat(flagged, TOKENIZER, template=PLAIN)
    assert chat.text == "u>Hi<eos>a>Yo<eos>u>Hi<eos>a>Yo<eos>"
    assert chat.assistant_mask.tolist() == [0] * 17 + [1, 1, 1]
    examples = encode_conversations([messages], TOKENIZER)
    assert examples.trained_tokens == 3


def test_weights_need_one_generation_block_per_assistant_turn():
    last_only = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match="writes 1 {% generation %} blocks for 2 assistant"):
        encode_chat([HI, {**YO, "weight": 0}, HI, YO], TOKENIZER, template=last_only)
    with pytest.raises(DataError, match="message 1 \\(assistant\\) has weight 2"):
        encode_chat([HI, {**YO, "weight": 2}], TOKENIZER)


def test_special_token_text_in_content_is_plain_text():
    messages = [{"role": "user", "content": "Hi<pad>"}, {"role": "assistant", "content": "Yo<eos>"}]
    chat = encode_chat(messages, TOKENIZER)
    assert chat.text == "<bos>user:\nHi<pad><eos>\nassistant:\nYo<eos><eos>\n"
    pad_text, eos_text = [LT, P, A, D, GT], [LT, E, O_, S, GT]
    assert chat.input_ids.tolist() == [
        BOS, *USER, H, I_, *pad_text, EOS, NL, *ASSISTANT, Y, O_, *eos_text, EOS, NL
    ]  # fmt: skip
    assert PAD not in chat.input_ids.tolist()
    # the whole reply is trained: the written "<eos>" does not end the turn
    assert chat.assistant_mask.tolist() == [0] * 27 + [1] * 8 + [0]
    prompt = encode_prompt(messages[:1], TOKENIZER)
    assert prompt.tolist() == [BOS, *USER, H, I_, *pad_text, EOS, NL, *ASSISTANT]
    # a template's own special texts still become the ids
    ids, _ = tokenize_text(TOKENIZER, "a<pad><eos>")
    assert ids == [A, PAD, EOS]


def test_a_defused_rendering_marks_only_the_contents_special_text():
    messages = [{"role": "user", "content": "<eos>"}, {"role": "assistant", "content": "Yo"}]
    text = PLAIN.render(messages)
    assert text == "u><eos><eos>a>Yo<eos>"
    markers = content_defused(PLAIN, messages, text, ["<eos>", "<pad>"], {})
    assert markers == "u>\ue002eos><eos>a>Yo<eos>"
    assert content_defused(PLAIN, [HI, YO], PLAIN.render([HI, YO]), ["<eos>"], {}) is None
    ids, offsets = tokenize_text(TOKENIZER, text, markers=markers)
    assert ids == [U, GT, LT, E, O_, S, GT, EOS, A, GT, Y, O_, EOS]
    assert offsets[7] == (7, 12)
    # a template that rewrites such content cannot be lined up with it, and is refused
    scrubbing = ChatTemplate(
        "{% for m in messages %}{{ m.content | replace('<pad>', '') }}|{% endfor %}"
    )
    with pytest.raises(ValueError, match=r"rewrites message content .* \['<pad>'\]"):
        encode_chat([HI, {**YO, "content": "Yo<pad>"}], TOKENIZER, template=scrubbing)


def test_a_literal_pad_is_never_padding_in_the_batches():
    rows = [
        {"instruction": "Say <pad> please", "output": "<pad> is a word <eos>"},
        {"instruction": "Say hi", "output": "hi"},
    ] * 4
    config = ChatDataConfig(max_len=32, batch_size=2, holdout=0.25)
    data = chat_data(datasets.Dataset.from_list(rows), tokenizer="word", config=config)
    pad, eos = data.tokenizer.pad_id, data.tokenizer.eos_id
    batches = [data.train.batch(step) for step in range(len(data.train))]
    for batch in batches:
        inside = batch["tokens"][batch["segments"] > 0]
        assert pad not in inside.tolist()  # every token of a conversation is read
    # <bos> and one <eos> per turn: the written "<eos>" is the word "eos" between "<" and ">"
    tokens = np.concatenate([batch["tokens"][batch["segments"] > 0] for batch in batches])
    conversations = sum(int(batch["segments"].max(axis=1).sum()) for batch in batches)
    assert int((tokens == eos).sum()) == 2 * conversations


def test_a_template_that_ignores_the_generation_prompt_is_refused():
    template = ChatTemplate(CHATML, {"eos_token": "<|im_end|>"}, origin="chatml.jinja")
    expected = (
        r"chatml.jinja ignores add_generation_prompt: it writes '<\|im_start\|>assistant\\n' "
        r"before each assistant reply"
    )
    with pytest.raises(ValueError, match=expected):
        encode_chat([HI, YO], TOKENIZER, template=template)
    with pytest.raises(ValueError, match=expected):
        encode_prompt([HI], TOKENIZER, template=template)
    with pytest.raises(ValueError, match=expected):
        encode_conversations([[HI, YO]] * 3, TOKENIZER, template=template)
    fixed = CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    chat = encode_chat([HI, YO], TOKENIZER, template=ChatTemplate(fixed))
    turn = chat.text.index("Yo")
    assert chat.text[turn - len("assistant\n") : turn] == "assistant\n"
    assert int(chat.assistant_mask.sum()) == len("Yo<|im_end|>\n")  # not the opening
    # a template whose prompt needs no opening ([/INST] ends it) passes
    mistral = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
        "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
        {"eos_token": "<eos>"},
    )
    chat = encode_chat([HI, YO], TOKENIZER, template=mistral)
    assert chat.text == "[INST] Hi [/INST]Yo<eos>"
    assert chat.assistant_mask.tolist()[-3:] == [1, 1, 1] and int(chat.assistant_mask.sum()) == 3


def test_a_tokenizer_json_encodes_special_text_in_content_as_text(tmp_path):
    from zoo.interop import pretrained_tokenizer

    from .chat_folders import qwen25_folder

    tokenizer = pretrained_tokenizer(qwen25_folder(tmp_path / "qwen"))
    im_end, pad = tokenizer.eos_id, tokenizer.pad_id  # <|im_end|>, <|endoftext|>
    messages = [
        {"role": "user", "content": "Say <|im_end|> or <|endoftext|>."},
        {"role": "assistant", "content": "I say <|im_end|>!"},
    ]
    chat = encode_chat(messages, tokenizer)
    ids = chat.input_ids.tolist()
    # Qwen's template adds its system turn: three turns, three <|im_end|> of its own
    assert ids.count(im_end) == 3 and pad not in ids
    assert tokenizer.decode(ids, skip_special=False) == chat.text
    trained = chat.input_ids[chat.assistant_mask == 1].tolist()
    assert tokenizer.decode(trained, skip_special=False) == "I say <|im_end|>!<|im_end|>"
    assert trained.count(im_end) == 1
    assert tokenizer.tokenizer.encode_special_tokens is False  # left as it was
    prompt = encode_prompt(messages[:1], tokenizer).tolist()
    assert prompt == ids[: len(prompt)]
    assert prompt.count(im_end) == 2 and pad not in prompt
