"""Conversation and instruction rows -> normalised messages: each format, its detection from the
column names, an explicit format, and the errors on rows that fit none."""

from __future__ import annotations

import datasets
import pytest

from zoo.data.chat.conversations import (
    check_messages,
    conversation_messages,
    conversations,
    detect_format,
)
from zoo.data.errors import DataError

HELLO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
]


def test_formats_are_detected_from_the_column_names():
    assert detect_format(["messages", "prompt", "prompt_id"]) == "messages"  # UltraChat
    assert detect_format(["conversations", "id"]) == "messages"  # ShareGPT
    assert detect_format(["instruction", "input", "output", "text"]) == "instruction"  # Alpaca
    assert detect_format(["prompt", "completion"]) == "prompt_completion"
    assert detect_format(["text"]) is None
    assert detect_format(["instruction", "response"]) is None


def test_messages_pass_through_as_plain_role_content_dicts():
    row = {"messages": [{**HELLO[0], "name": "rules"}, *HELLO[1:]], "id": 7}
    assert conversation_messages(row) == HELLO  # extra keys dropped


def test_sharegpt_speakers_become_roles():
    row = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!", "weight": 1},
        ]
    }
    assert conversation_messages(row) == HELLO


def test_alpaca_instruction_input_and_output():
    row = {"instruction": "Translate to French.", "input": "cat", "output": "chat", "text": ""}
    assert conversation_messages(row) == [
        {"role": "user", "content": "Translate to French.\n\ncat"},
        {"role": "assistant", "content": "chat"},
    ]
    without_input = {"instruction": "Say hi.", "input": "", "output": "Hi!", "system": "Be kind."}
    assert conversation_messages(without_input) == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ]


def test_prompt_completion_as_text_and_as_trl_conversations():
    assert conversation_messages({"prompt": "Hi", "completion": "Hello!"}) == HELLO[1:]
    row = {"prompt": HELLO[:2], "completion": HELLO[2:]}  # TRL's conversational form
    assert conversation_messages(row) == HELLO
    assert conversation_messages({"prompt": HELLO[:2], "completion": "Hello!"}) == HELLO


def test_an_explicit_format_overrides_detection():
    row = {"messages": HELLO, "prompt": "Hey", "completion": "Yo"}
    assert conversation_messages(row) == HELLO
    assert conversation_messages(row, format="prompt_completion") == [
        {"role": "user", "content": "Hey"},
        {"role": "assistant", "content": "Yo"},
    ]
    with pytest.raises(ValueError, match="unknown conversation format 'chatml'"):
        conversation_messages(row, format="chatml")


def test_a_dataset_is_read_row_by_row_in_one_format():
    rows = datasets.Dataset.from_list(
        [
            {"instruction": "Add 2 and 2.", "input": "", "output": "4"},
            {"instruction": "Spell it.", "input": "4", "output": "four"},
        ]
    )
    assert list(conversations(rows)) == [
        [{"role": "user", "content": "Add 2 and 2."}, {"role": "assistant", "content": "4"}],
        [{"role": "user", "content": "Spell it.\n\n4"}, {"role": "assistant", "content": "four"}],
    ]
    # ShareGPT rows as datasets stores them: keys one turn lacks are filled with None
    chats = datasets.Dataset.from_list(
        [
            {
                "conversations": [
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Yo", "weight": 1},
                ]
            }
        ]
    )
    assert chats[0]["conversations"][0]["weight"] is None
    assert list(conversations(chats)) == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    ]


def test_a_row_that_fits_no_format_names_the_row_and_the_columns():
    rows = [{"prompt": "a", "completion": "b"}] * 3 + [{"question": "a", "answer": "b"}]
    with pytest.raises(DataError) as error:
        for index, row in enumerate(rows):
            conversation_messages(row, index=index)
    message = str(error.value)
    assert "row 3 fits no conversation format" in message
    assert "'messages'" in message and "'instruction' and 'output'" in message
    assert "found ['answer', 'question']" in message
    assert isinstance(error.value, ValueError)
    with pytest.raises(DataError, match=r"row 1 lacks the column 'completion'.*found \['prompt'\]"):
        list(conversations([{"prompt": "a", "completion": "b"}, {"prompt": "c"}]))
    with pytest.raises(DataError, match="row 0 lacks the column 'output'"):
        conversation_messages({"instruction": "a"}, format="instruction")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, r"message 0 has the role 'robot'"),
        ({"conversations": [{"from": "bing", "value": "x"}]}, r"message 0 is from 'bing'"),
        ({"messages": [*HELLO[:2], {"role": "assistant", "content": "  "}]}, r"2 \(assistant\)"),
        ({"messages": [{"role": "user", "content": ["a", "b"]}]}, r"has list content"),
        ({"messages": [{"content": "x"}]}, r"with 'role' and 'content'"),
        ({"messages": "Hi"}, r"should hold a list of messages, found str"),
        ({"messages": []}, r"empty conversation"),
        ({"instruction": "Say hi.", "output": ""}, r"message 1 \(assistant\) has empty content"),
        ({"prompt": "Hi", "completion": 3}, r"'completion' should hold text or a list"),
        ({"messages": HELLO[:2]}, r"no assistant turn \(its roles: \['system', 'user'\]\)"),
    ],
)
def test_bad_rows_get_clear_errors(row, expected):
    with pytest.raises(DataError, match=expected):
        conversation_messages(row, index=5)


@pytest.mark.parametrize(
    ("value", "prompt"),
    [(4, "Add 4.\n\n4"), (2.5, "Add 4.\n\n2.5"), (float("nan"), "Add 4."), (None, "Add 4.")],
)
def test_alpaca_columns_are_read_as_text(value, prompt):
    # a number is written as its text (as TRL and axolotl format it); NaN is an empty CSV cell
    row = {"instruction": "Add 4.", "input": value, "output": 8, "system": 0}
    assert conversation_messages(row) == [
        {"role": "system", "content": "0"},
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": "8"},
    ]


@pytest.mark.parametrize(
    ("column", "value", "kind"),
    [("input", [1, 2], "list"), ("input", {"a": 1}, "dict"), ("output", True, "bool"),
     ("system", ["Be brief."], "list"), ("instruction", {"text": "Hi"}, "dict")],
)  # fmt: skip
def test_alpaca_columns_that_are_not_text_are_refused(column, value, kind):
    row = {"instruction": "Add.", "input": "4", "output": "8", column: value}
    expected = rf"row 7: the column '{column}' holds {kind} .*'instruction' format expects text"
    with pytest.raises(DataError, match=expected):
        conversation_messages(row, index=7)


def test_a_null_value_is_named_as_null_not_as_a_missing_column():
    with pytest.raises(DataError, match=r"row 2 has no value in 'output' \(null\), which the"):
        conversation_messages({"instruction": "Hi", "output": None}, index=2)
    with pytest.raises(DataError, match=r"row 2 has no value in 'output' \(null\)"):
        conversation_messages({"instruction": "Hi", "output": float("nan")}, index=2)
    with pytest.raises(DataError, match=r"row 0 has no value in 'messages' \(null\)"):
        conversation_messages({"messages": None})
    with pytest.raises(DataError, match=r"row 0 has no value in 'completion' \(null\)"):
        conversation_messages({"prompt": "Hi", "completion": None})


def test_a_weight_0_turn_keeps_its_mark_and_weight_1_is_the_default():
    turns = [HELLO[1], {**HELLO[2], "weight": 0}, HELLO[1], {**HELLO[2], "weight": 1.0}]
    assert conversation_messages({"messages": turns}) == [
        HELLO[1], {**HELLO[2], "weight": 0}, HELLO[1], HELLO[2]
    ]  # fmt: skip
    # SlimOrca's ShareGPT weights: null on system, 0.0 on human, 1.0 on gpt
    sharegpt = [
        {"from": "system", "value": "Be brief.", "weight": None},
        {"from": "human", "value": "Hi", "weight": 0.0},
        {"from": "gpt", "value": "Hello!", "weight": 1.0},
        {"from": "human", "value": "Hi", "weight": 0.0},
        {"from": "gpt", "value": "Hello!", "weight": 0},
    ]
    assert conversation_messages({"conversations": sharegpt}) == [
        *HELLO, HELLO[1], {**HELLO[2], "weight": 0}
    ]  # fmt: skip
    flagged = [HELLO[1], {**HELLO[2], "train": False}, HELLO[1], {**HELLO[2], "training": True}]
    assert conversation_messages({"messages": flagged})[1] == {**HELLO[2], "weight": 0}


@pytest.mark.parametrize(
    ("mark", "expected"),
    [
        ({"weight": 0.5}, r"row 4, message 1 has weight 0.5; a turn's weight is 0 .* or 1"),
        ({"weight": "0"}, r"message 1 has weight '0'"),
        ({"weight": True}, r"message 1 has weight True"),
        ({"train": "no"}, r"message 1 has train='no'; the flag is true .* or false"),
        ({"weight": 1, "train": False}, r"says both trained and not trained"),
    ],
)
def test_a_bad_weight_is_refused_naming_the_row(mark, expected):
    with pytest.raises(DataError, match=expected):
        conversation_messages({"messages": [HELLO[1], {**HELLO[2], **mark}]}, index=4)


def test_weights_that_cannot_be_honoured_are_refused():
    trained_user = [{**HELLO[1], "weight": 1}, HELLO[2]]
    with pytest.raises(DataError, match=r"row 3, message 0 \(user\) is marked trained"):
        conversation_messages({"messages": trained_user}, index=3)
    untrained = [HELLO[1], {**HELLO[2], "weight": 0}]
    with pytest.raises(DataError, match="row 3: every assistant turn has weight 0"):
        conversation_messages({"messages": untrained}, index=3)
    assert conversation_messages({"messages": untrained}, require_assistant=False)[1]["weight"] == 0


def test_a_prompt_without_an_assistant_turn_is_accepted_when_asked():
    assert conversation_messages({"messages": HELLO[:2]}, require_assistant=False) == HELLO[:2]
    assert check_messages(HELLO[1:2], require_assistant=False) == HELLO[1:2]
