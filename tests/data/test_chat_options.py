"""What the loss trains (`train_on`: auto, assistant, completion, last, all), where the messages
are and what their roles are called (`messages_column`, `roles`), a row's `tools`, rows that mix
formats, and templates whose markers the tokenizer cannot write (zoo.data.chat.markers)."""

from __future__ import annotations

import importlib.util
import json

import datasets
import pytest

from zoo.data import CharTokenizer, DataError
from zoo.data.chat.batches import encode_conversations
from zoo.data.chat.conversations import conversation_messages, conversations
from zoo.data.chat.datasets import chat_data
from zoo.data.chat.markers import template_marker_report, template_markers
from zoo.data.chat.options import ChatDataConfig, resolve_train_on
from zoo.data.chat.template import DEFAULT_TEMPLATE, ChatTemplate
from zoo.data.tokenizers.build import build_tokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
TOKENIZER = CharTokenizer("\n:HIYaeinorstuyk")
HI, YO = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}
OK = {"role": "assistant", "content": "ok"}
# the default template writes "assistant:\n" + reply + <eos> per reply: 2 + 1 tokens each
REPLY = 3
CONFIG = ChatDataConfig(max_len=64, batch_size=1, pack=False, holdout=0.5)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def trained(rows: list[dict], **options) -> int:
    data = chat_data(datasets.Dataset.from_list(rows), tokenizer=TOKENIZER,
                     config=ChatDataConfig(max_len=64, batch_size=1, pack=False, **options))  # fmt: skip
    return sum(count["trained_tokens"] for count in data.counts.values())


def test_train_on_defaults_to_auto_and_is_checked():
    assert ChatDataConfig().train_on == "auto"
    assert resolve_train_on("auto", "prompt_completion") == "completion"
    assert resolve_train_on("auto", "messages") == "assistant"
    with pytest.raises(ValueError, match="train_on must be one of"):
        ChatDataConfig(train_on="user")
    with pytest.raises(ValueError, match="'completion' trains the completion .* 'instruction'"):
        ChatDataConfig(train_on="completion", format="instruction")
    with pytest.raises(ValueError, match=r"--train-on completion, train_on='completion'"):
        resolve_train_on("completion", "messages")


def test_completion_trains_the_completion_not_the_prompts_assistant_turn():
    prompt = [HI, YO, HI]  # the prompt holds an assistant turn
    pairs = [{"prompt": prompt, "completion": [OK]}] * 2
    same_as_messages = [{"messages": [*prompt, OK]}] * 2
    completion, every_reply = trained(pairs), trained(same_as_messages)
    assert completion == 2 * REPLY  # auto is completion for prompt/completion rows
    assert every_reply == 2 * 2 * REPLY
    assert completion < every_reply
    assert trained(pairs, train_on="assistant") == every_reply
    with pytest.raises(ValueError, match="needs prompt/completion rows, and these rows are in"):
        trained(same_as_messages, train_on="completion")


def test_last_trains_the_final_reply_and_weights_still_count():
    rows = [{"messages": [HI, YO, HI, OK]}] * 2
    assert trained(rows, train_on="last") == 2 * REPLY
    assert trained(rows) == 2 * 2 * REPLY
    weighted = [{"messages": [HI, YO, HI, {**OK, "weight": 0}]}] * 2
    assert trained(weighted) == 2 * REPLY
    with pytest.raises(DataError, match="each assistant turn it trains has weight 0"):
        trained(weighted, train_on="last")


def test_roles_map_other_speaker_names():
    row = {"conversations": [{"from": "person", "value": "Hi"}, {"from": "bot", "value": "Yo"}]}
    with pytest.raises(DataError, match=r"from 'person'.*--role person=user"):
        conversation_messages(row)
    roles = {"person": "user", "bot": "assistant"}
    assert conversation_messages(row, roles=roles) == [HI, YO]
    renamed = {"messages": [{"role": "human", "content": "Hi"}, {"role": "gpt", "content": "Yo"}]}
    assert conversation_messages(renamed, roles={"human": "user", "gpt": "assistant"}) == [HI, YO]
    sharegpt = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}
    assert conversation_messages(sharegpt) == [HI, YO]  # ShareGPT's own names by default
    with pytest.raises(ValueError, match="maps 'bot' to 'robot'"):
        ChatDataConfig(roles={"bot": "robot"})
    data = [{"conversations": row["conversations"]}] * 2
    assert trained(data, roles=roles) == 2 * REPLY


def test_messages_are_read_from_the_column_named():
    rows = [{"dialog": [HI, YO], "id": 1}, {"dialog": [HI, OK], "id": 2}]
    assert list(conversations(rows, messages_column="dialog")) == [[HI, YO], [HI, OK]]
    assert trained(rows, messages_column="dialog") == 2 * REPLY
    with pytest.raises(DataError, match=r"no column 'chat' .* columns are \['dialog', 'id'\]"):
        trained(rows, messages_column="chat")
    with pytest.raises(ValueError, match="messages_column must name a column"):
        ChatDataConfig(messages_column=" ")


def test_rows_that_mix_formats_name_both():
    rows = [{"messages": [HI, YO]}, {"prompt": "Hi", "completion": "Yo"}]
    with pytest.raises(DataError, match="row 1 .*mix the formats 'messages' and 'prompt_complet"):
        list(conversations(rows))
    # a JSON file of such rows loads with every column, null where a row lacks it
    columns = {"messages": [[HI, YO], None], "prompt": [None, "Hi"], "completion": [None, "Yo"]}
    data = datasets.Dataset.from_dict(columns)
    with pytest.raises(DataError, match="mix the formats 'messages' and 'prompt_completion'"):
        chat_data(data, tokenizer=TOKENIZER, config=CONFIG)


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
TOOLS_TEMPLATE = ChatTemplate(
    "{% if tools %}tools:{{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
    + DEFAULT_TEMPLATE,
    {"eos_token": "<eos>", "bos_token": "<bos>"},
)


def test_a_rows_tools_reach_the_template():
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {}}}]}  # fmt: skip
    for tools in ([TOOL], json.dumps([TOOL])):
        conversation = conversation_messages({"messages": [HI, call], "tools": tools})
        assert conversation.tools == [TOOL]
        assert conversation[1]["tool_calls"] == call["tool_calls"]  # no "empty content" error
    rows = [{"messages": [HI, YO], "tools": json.dumps([TOOL])}]
    tokenizer = CharTokenizer("\n:HIYaeinorstuyklhw,")
    examples = encode_conversations(conversations(rows), tokenizer, template=TOOLS_TEMPLATE)
    text = tokenizer.decode(examples.tokens.row(0), skip_special=False)
    assert text.startswith("tools:weather\n<bos>user:")
    with pytest.raises(DataError, match="'tools' holds text that is not JSON"):
        conversation_messages({"messages": [HI, YO], "tools": "[{"})
    with pytest.raises(DataError, match="'tools' nests deeper than 64 levels"):
        conversation_messages({"messages": [HI, YO], "tools": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(ValueError, match="never mentions 'tools'"):
        encode_conversations(conversations(rows), tokenizer,
                             template=ChatTemplate(DEFAULT_TEMPLATE, {"eos_token": "<eos>"}))  # fmt: skip


def test_markers_a_tokenizer_cannot_write_are_reported_and_refused():
    template = ChatTemplate(CHATML, origin="chatml.jinja")
    assert template_markers(template) == ["<|im_start|>", "<|im_end|>"]
    words = build_tokenizer("word", ["user: Hi", "assistant: Yo"])
    report = template_marker_report(template, words)
    assert report.unknown == ["<|im_start|>", "<|im_end|>"]  # "im_start" is no word it knows
    chars = CharTokenizer("<|>_imstartend\n:HIYousr")
    spelled = template_marker_report(template, chars)
    assert (spelled.unknown, spelled.split) == ([], ["<|im_start|>", "<|im_end|>"])
    assert len(spelled.markers["<|im_end|>"]) == len("<|im_end|>")
    rows = datasets.Dataset.from_list([{"messages": [HI, YO]}] * 4)
    for kind in ("word", "char"):
        with pytest.raises(ValueError) as refused:
            chat_data(rows, tokenizer=kind, config=ChatDataConfig(template=CHATML, max_len=64,
                                                                  batch_size=1))  # fmt: skip
        message = str(refused.value)
        assert "writes 2 marker(s)" in message and "cannot write 2 of them" in message
        assert "<|im_end|>" in message and "a tokenizer that has these tokens" in message
    # zoo's default template writes no marker a learnt vocabulary lacks
    assert chat_data(rows, tokenizer="word", config=CONFIG).counts
