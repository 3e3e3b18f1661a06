"""Chat templates against transformers' `apply_chat_template`, on folders laid out like the hub
snapshots of Qwen2.5, Llama 3.2 and SmolLM2 instruct models, with their real templates
(chat_folders.py): the rendered text, the ids, the generation prompt, and the assistant mask.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat, encode_prompt
from zoo.interop import FastTokenizer, pretrained_tokenizer

from .chat_folders import FOLDERS, READ_AS_IS, template

pytestmark = pytest.mark.hf
pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = {"role": "user", "content": "Hello, how are you?"}
GREAT = {"role": "assistant", "content": "I'm doing great, thank you!"}
JOKE = {"role": "user", "content": "Tell me a joke about cats."}
# Llama's template trims the content; the digits are split one by one by SmolLM2's tokenizer.
CATS = {"role": "assistant", "content": "  Why did the cat sit on the computer? 2 + 2 = 4.\n"}
CONVERSATIONS = {
    "one turn": [HELLO, GREAT],
    "system": [SYSTEM, HELLO, GREAT],
    "multi-turn": [SYSTEM, HELLO, GREAT, JOKE, CATS],
    "multi-turn, no system": [HELLO, GREAT, JOKE, CATS],
}
PROMPTS = {"user": [HELLO], "system, user": [SYSTEM, HELLO], "history": [HELLO, GREAT, JOKE]}
# Llama 3.2's template writes today's date unless told one: the same for both sides.
VARIABLES = {"llama-3.2": {"date_string": "26 Jul 2024"}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_snapshots")
    return {family: build(root / family) for family, build in FOLDERS.items()}


@pytest.fixture(scope="module")
def reference(folders):
    """transformers' tokenizer of each folder (see READ_AS_IS for SmolLM2)."""
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


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("family", FOLDERS)
def test_text_and_ids_equal_apply_chat_template(folders, reference, family, name):
    messages, variables = CONVERSATIONS[name], VARIABLES.get(family, {})
    tokenizer = pretrained_tokenizer(folders[family])
    assert isinstance(tokenizer, FastTokenizer)
    chat = encode_chat(messages, tokenizer, **variables)
    expected = reference[family].apply_chat_template(messages, tokenize=False, **variables)
    assert chat.text == expected
    assert chat.input_ids.tolist() == hf_ids(reference[family], messages, **variables)


@pytest.mark.parametrize("name", PROMPTS)
@pytest.mark.parametrize("family", FOLDERS)
def test_prompt_ids_equal_apply_chat_template_with_generation_prompt(
    folders, reference, family, name
):
    messages, variables = PROMPTS[name], VARIABLES.get(family, {})
    ids = encode_prompt(messages, pretrained_tokenizer(folders[family]), **variables)
    expected = hf_ids(reference[family], messages, add_generation_prompt=True, **variables)
    assert ids.tolist() == expected


@pytest.mark.parametrize("family", FOLDERS)
def test_the_template_from_the_folder_beats_none_and_keeps_special_tokens(folders, family):
    tokenizer = pretrained_tokenizer(folders[family])
    from_tokenizer = chat_template_for(tokenizer)
    from_folder = chat_template_for(tokenizer, folder=folders[family])
    assert from_tokenizer.source == from_folder.source == template(f"{family}-instruct")
    assert from_tokenizer.special_tokens == from_folder.special_tokens
    assert from_folder.special_tokens["eos_token"] in {"<|im_end|>", "<|eot_id|>"}
    if family == "qwen2.5":  # "bos_token": null: no bos_token variable at all, as transformers
        assert "bos_token" not in from_folder.special_tokens


def qwen_with_generation_blocks() -> str:
    """Qwen2.5's template with `{% generation %}` around what the assistant writes: its content
    and `<|im_end|>`, not the newline after it (the template's only change)."""
    real = template("qwen2.5-instruct")
    plain_turn = (
        '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
        '(message.role == "assistant" and not message.tool_calls) %}\n'
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
        "'\\n' }}\n"
    )
    split_turns = (
        '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
        "'\\n' }}\n"
        '    {%- elif message.role == "assistant" and not message.tool_calls %}\n'
        "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
        "        {%- generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}\n"
        "        {{- '\\n' }}\n"
    )
    assert real.count(plain_turn) == 1
    return real.replace(plain_turn, split_turns)


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_mask_equals_return_assistant_tokens_mask(folders, reference, name):
    messages, tokenizer = CONVERSATIONS[name], pretrained_tokenizer(folders["qwen2.5"])
    marked = qwen_with_generation_blocks()
    expected = reference["qwen2.5"].apply_chat_template(
        messages, chat_template=marked, tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    special = chat_template_for(tokenizer).special_tokens
    with_blocks = encode_chat(messages, tokenizer, template=ChatTemplate(marked, special))
    assert with_blocks.input_ids.tolist() == list(expected["input_ids"])
    assert with_blocks.assistant_mask.tolist() == list(expected["assistant_masks"])
    # The real template has no blocks: its turns, read from renderings of the conversation's
    # prefixes, give the same mask.
    plain = encode_chat(messages, tokenizer)
    assert plain.input_ids.tolist() == list(expected["input_ids"])
    assert plain.assistant_mask.tolist() == list(expected["assistant_masks"])
    assert sum(expected["assistant_masks"]) > 0


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("family", ["llama-3.2", "smollm2"])
def test_mask_covers_each_assistant_content_and_its_end_of_turn(folders, reference, family, name):
    messages, variables = CONVERSATIONS[name], VARIABLES.get(family, {})
    tokenizer, hf = pretrained_tokenizer(folders[family]), reference[family]
    chat = encode_chat(messages, tokenizer, **variables)
    end_of_turn = tokenizer.eos_id  # <|eot_id|>, <|im_end|>
    expected = [0] * len(chat.input_ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        # The turn starts where transformers' generation prompt for it ends, and holds the
        # content as the template writes it (Llama's trimmed) and the end-of-turn token.
        start = len(hf_ids(hf, messages[:turn], add_generation_prompt=True, **variables))
        content = message["content"].strip() if family == "llama-3.2" else message["content"]
        turn_ids = [*hf.encode(content, add_special_tokens=False), end_of_turn]
        assert chat.input_ids[start : start + len(turn_ids)].tolist() == turn_ids
        expected[start : start + len(turn_ids)] = [1] * len(turn_ids)
    assert chat.assistant_mask.tolist() == expected
