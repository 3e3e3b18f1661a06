"""Assistant turns read from the whole rendering, on the real templates of eleven instruct families
(chat_folders.py) against transformers' `apply_chat_template`: the text, the ids and the
generation prompt are transformers'; the assistant mask is each reply as the template writes it
and its end-of-turn token (hand-built from transformers' own ids), and transformers'
`return_assistant_tokens_mask` where a template has `{% generation %}` blocks.

Phi-3 writes eos only after a conversation's last message, and Qwen1.5 writes `<|im_end|>`
after every message but the last: reading a turn from the conversation that ends with it
refused the first and left the second's `<|im_end|>` out of the mask.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat, encode_prompt
from zoo.interop import pretrained_tokenizer

from .chat_folders import ALL_FOLDERS, READ_AS_IS, template

pytestmark = pytest.mark.hf
pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = {"role": "user", "content": "Hello, how are you?"}
GREAT = {"role": "assistant", "content": "I'm doing great, thank you!"}
JOKE = {"role": "user", "content": "Tell me a joke about cats."}
CATS = {"role": "assistant", "content": "  Why did the cat sit on the computer? 2 + 2 = 4.\n"}
CONVERSATIONS = {
    "one turn": [HELLO, GREAT],
    "system": [SYSTEM, HELLO, GREAT],
    "multi-turn": [SYSTEM, HELLO, GREAT, JOKE, CATS],
    "multi-turn, no system": [HELLO, GREAT, JOKE, CATS],
    "ends with a user turn": [HELLO, GREAT, JOKE],
}
# Gemma refuses a system turn; Mistral's moves it into the last user turn (refused below).
NO_SYSTEM = {"gemma-2", "mistral-v0.3"}
# The token that ends a reply, and the reply as the template writes it.
END_OF_TURN = {
    "qwen2.5": "<|im_end|>", "qwen1.5": "<|im_end|>", "smollm2": "<|im_end|>",
    "llama-3.2": "<|eot_id|>", "llama-3.1": "<|eot_id|>", "phi-3": "<|end|>",
    "phi-3.5": "<|end|>", "gemma-2": "<end_of_turn>", "gemma-3": "<end_of_turn>", "zephyr": "</s>",
    "mistral-v0.3": "</s>",
}  # fmt: skip
WRITTEN = {
    "llama-3.2": str.strip, "llama-3.1": str.strip, "gemma-2": str.strip, "gemma-3": str.strip,
    "mistral-v0.3": lambda content: " " + content.strip(),
}  # fmt: skip
VARIABLES = {"llama-3.2": {"date_string": "26 Jul 2024"}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_families")
    return {family: build(root / family) for family, build in ALL_FOLDERS.items()}


@pytest.fixture(scope="module")
def reference(folders):
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    return {
        family: (
            transformers.PreTrainedTokenizerFast
            if family in READ_AS_IS
            else transformers.AutoTokenizer
        ).from_pretrained(str(folder))
        for family, folder in folders.items()
    }


def hf_ids(reference, messages, **options) -> list[int]:
    return list(reference.apply_chat_template(messages, tokenize=True, return_dict=True,
                                              **options)["input_ids"])  # fmt: skip


def cases():
    for family in ALL_FOLDERS:
        for name, messages in CONVERSATIONS.items():
            if not (family in NO_SYSTEM and messages[0]["role"] == "system"):
                yield pytest.param(family, name, id=f"{family}-{name}")


@pytest.mark.parametrize(("family", "name"), list(cases()))
def test_text_ids_and_mask_of_every_family(folders, reference, family, name):
    messages, variables = CONVERSATIONS[name], VARIABLES.get(family, {})
    tokenizer, hf = pretrained_tokenizer(folders[family]), reference[family]
    chat = encode_chat(messages, tokenizer, **variables)
    end_id = hf.convert_tokens_to_ids(END_OF_TURN[family])
    text = hf.apply_chat_template(messages, tokenize=False, **variables)
    ids = hf_ids(hf, messages, **variables)
    if family == "qwen1.5" and messages[-1]["role"] == "assistant":
        # the last reply gets the <|im_end|> the template writes only when the chat goes on
        text, ids = text + "<|im_end|>", [*ids, end_id]
    assert chat.text == text
    assert chat.input_ids.tolist() == ids
    expected = [0] * len(ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(hf_ids(hf, messages[:turn], add_generation_prompt=True, **variables))
        content = WRITTEN.get(family, str)(message["content"])
        reply = [*hf.encode(content, add_special_tokens=False), end_id]
        assert ids[start : start + len(reply)] == reply
        expected[start : start + len(reply)] = [1] * len(reply)
    assert chat.assistant_mask.tolist() == expected
    assert sum(expected) > 0


@pytest.mark.parametrize("family", list(ALL_FOLDERS))
def test_generation_prompts_equal_apply_chat_template(folders, reference, family):
    variables = VARIABLES.get(family, {})
    tokenizer = pretrained_tokenizer(folders[family])
    for messages in ([HELLO], [HELLO, GREAT, JOKE]):
        ids = encode_prompt(messages, tokenizer, **variables)
        assert ids.tolist() == hf_ids(
            reference[family], messages, add_generation_prompt=True, **variables
        )


@pytest.mark.parametrize(
    ("family", "marked"),
    [("phi-3", "phi-3-mini-4k-instruct-generation"), ("gemma-2", "gemma-2-2b-it-generation")],
)
def test_generation_block_variants_equal_return_assistant_tokens_mask(
    folders, reference, family, marked
):
    tokenizer = pretrained_tokenizer(folders[family])
    special = chat_template_for(tokenizer).special_tokens
    blocks = ChatTemplate(template(marked), special, origin=marked)
    for messages in ([HELLO, GREAT], [HELLO, GREAT, JOKE, CATS], [HELLO, GREAT, JOKE]):
        expected = reference[family].apply_chat_template(
            messages, chat_template=blocks.source, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
        chat = encode_chat(messages, tokenizer, template=blocks)
        assert chat.input_ids.tolist() == list(expected["input_ids"])
        assert chat.assistant_mask.tolist() == list(expected["assistant_masks"])
        # the plain template's mask is the blocks' but for what they add after the end of
        # turn (Phi-3's newline and closing eos, the model never writes them)
        plain = encode_chat(messages, tokenizer)
        assert plain.input_ids.tolist() == chat.input_ids.tolist()
        pairs = list(zip(plain.assistant_mask.tolist(), expected["assistant_masks"], strict=True))
        assert all(block for mine, block in pairs if mine)
        extra = [t for t, (mine, block) in zip(chat.input_ids, pairs) if block and not mine]
        assert {reference[family].decode([t]) for t in extra} <= {"\n", "<|endoftext|>"}


def test_a_template_that_moves_the_system_turn_is_refused_naming_it_and_the_fixes(folders):
    tokenizer = pretrained_tokenizer(folders["mistral-v0.3"])
    # Mistral v0.3 writes the system message into the last user turn only
    with pytest.raises(ValueError) as refused:
        encode_chat([SYSTEM, HELLO, GREAT], tokenizer)
    message = str(refused.value)
    assert "chat template of the" in message and "cannot be read turn by turn" in message
    assert "{% generation %}" in message and "--train-on all" in message
    # training on every token does not read the turns
    every = encode_chat([SYSTEM, HELLO, GREAT], tokenizer, read_turns=False)
    assert every.assistant_mask.all()


def test_role_orders_are_read_or_refused_never_guessed(folders, reference):
    qwen, hf = pretrained_tokenizer(folders["qwen2.5"]), reference["qwen2.5"]
    end = hf.convert_tokens_to_ids("<|im_end|>")
    for messages in ([HELLO, JOKE, GREAT], [HELLO, GREAT, SYSTEM, JOKE, GREAT]):
        chat = encode_chat(messages, qwen)
        assert chat.input_ids.tolist() == hf_ids(hf, messages)
        reply = [*hf.encode(GREAT["content"], add_special_tokens=False), end]
        assert chat.assistant_mask.sum() == len(reply) * messages.count(GREAT)
    # a greeting: read where the template writes the empty conversation (Phi-3), named where not
    phi = encode_chat([GREAT, HELLO, GREAT], pretrained_tokenizer(folders["phi-3"]))
    assert phi.assistant_mask.sum() == 2 * (len(reference["phi-3"].encode(GREAT["content"])) + 1)
    with pytest.raises(ValueError, match="opens with an assistant turn, and the chat template"):
        encode_chat([GREAT, HELLO, GREAT], qwen)
    with pytest.raises(ValueError, match="roles must alternate"):  # Gemma's own refusal
        encode_chat([HELLO, JOKE, GREAT], pretrained_tokenizer(folders["gemma-2"]))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ],
}
RESULT = {"role": "tool", "content": "22 degrees"}


def test_tools_and_tool_calls_render_as_transformers_renders_them(folders, reference):
    tokenizer, hf = pretrained_tokenizer(folders["qwen2.5"]), reference["qwen2.5"]
    messages = [HELLO, CALL, RESULT, GREAT]
    chat = encode_chat(messages, tokenizer, tools=TOOLS)
    assert chat.text == hf.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert chat.input_ids.tolist() == hf_ids(hf, messages, tools=TOOLS)
    end = hf.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    expected = [0] * len(chat.input_ids)
    for turn, written in ((1, call), (3, GREAT["content"])):
        start = len(hf_ids(hf, messages[:turn], tools=TOOLS, add_generation_prompt=True))
        reply = [*hf.encode(written, add_special_tokens=False), end]
        assert chat.input_ids[start : start + len(reply)].tolist() == reply
        expected[start : start + len(reply)] = [1] * len(reply)
    assert chat.assistant_mask.tolist() == expected
    # a template that never mentions tools would drop them: refused, naming what it lacks
    with pytest.raises(ValueError, match="never mentions 'tools'"):
        encode_chat(messages, pretrained_tokenizer(folders["gemma-2"]), tools=TOOLS)
    with pytest.raises(ValueError, match="never mentions 'tool_calls'"):
        encode_chat([HELLO, CALL, RESULT, GREAT], pretrained_tokenizer(folders["zephyr"]))
