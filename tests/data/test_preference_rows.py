"""Preference rows: formats told from the columns, the implicit prompt, truncation, errors."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.data import (
    DataError,
    PreferenceDataConfig,
    build_tokenizer,
    encode_prompt,
    encode_rows,
    preference_data,
)
from zoo.data.chat.preference import (
    PreferencePair,
    encode_pair,
    pair_arrays,
    preference_format,
    row_parts,
    split_prompt,
)

SKY = [{"role": "user", "content": "What color is the sky?"}]
BLUE = [{"role": "assistant", "content": "It is blue."}]
GREEN = [{"role": "assistant", "content": "It is green."}]


def test_formats_are_told_from_the_columns():
    assert preference_format({"prompt": "a", "chosen": "b", "rejected": "c"}) == ("standard", False)
    assert preference_format({"chosen": SKY + BLUE, "rejected": SKY + GREEN}) == (
        "conversational",
        True,
    )
    with pytest.raises(DataError, match=r"missing \['rejected'\]"):
        preference_format({"prompt": "a", "chosen": "b"})


def test_implicit_prompt_is_the_shared_start():
    assert split_prompt(SKY + BLUE, SKY + GREEN) == (SKY, BLUE, GREEN)
    # text: the space before the split goes with the answers, as in TRL
    assert split_prompt("The sky is blue.", "The sky is green.") == (
        "The sky is",
        " blue.",
        " green.",
    )


def test_malformed_rows_name_the_row():
    with pytest.raises(DataError, match="row 3: the 'chosen' answer is empty"):
        row_parts({"prompt": "q", "chosen": " ", "rejected": "x"}, 3)
    with pytest.raises(DataError, match="row 1: 'chosen' and 'rejected' are identical"):
        row_parts({"prompt": "q", "chosen": "same", "rejected": "same"}, 1)
    with pytest.raises(DataError, match="row 0: the 'rejected' answer is empty after the prompt"):
        row_parts({"chosen": "abc", "rejected": "ab"}, 0)
    with pytest.raises(
        DataError, match="row 2: 'rejected' holds text 'no', expected a list of messages"
    ):
        row_parts({"prompt": SKY, "chosen": BLUE, "rejected": "no"}, 2)


def test_a_message_that_is_no_mapping_names_the_row():
    """Before: AttributeError: 'str' object has no attribute 'get', from inside the encoding."""
    rows = [{"prompt": SKY, "chosen": BLUE, "rejected": GREEN},
            {"prompt": ["Why?"], "chosen": BLUE, "rejected": GREEN}]  # fmt: skip
    tokenizer = build_tokenizer("word", ["what color is the sky it blue green why"])
    with pytest.raises(DataError, match="row 1: message 0 of 'prompt' is str, expected a mapping"):
        encode_rows(rows, tokenizer)


def char_tokenizer():
    return build_tokenizer("char", ["abcdefghij +=0123456789"])


def test_truncation_keeps_the_prompt_end_and_the_answer_start():
    tokenizer = char_tokenizer()
    parts = ("abcdef", "ghij", "12")
    pair = encode_pair(parts, tokenizer, config=PreferenceDataConfig(max_prompt_len=3))
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    assert pair.prompt == tokenizer.encode("def")  # the last three: bos dropped with the start
    assert pair.chosen == [*tokenizer.encode("ghij"), eos]
    pair = encode_pair(parts, tokenizer, config=PreferenceDataConfig(max_completion_len=2))
    assert pair.prompt == [bos, *tokenizer.encode("abcdef")]
    assert pair.chosen == tokenizer.encode("gh") and pair.rejected == tokenizer.encode("12")
    pair = encode_pair(parts, tokenizer, config=PreferenceDataConfig(max_len=9))
    assert len(pair.prompt) == 7 and len(pair.chosen) == len(pair.rejected) == 2  # 9 - 7
    with pytest.raises(DataError, match="row 4: the prompt has 7 tokens.*max_len=7"):
        encode_pair(parts, tokenizer, config=PreferenceDataConfig(max_len=7), index=4)


def test_pair_arrays_pad_and_mask_the_answers():
    arrays = pair_arrays([PreferencePair([1, 5], [6, 2], [7, 8, 2])], pad_id=0)
    np.testing.assert_array_equal(arrays["tokens"][0], [[1, 5, 6, 2, 0], [1, 5, 7, 8, 2]])
    np.testing.assert_array_equal(arrays["loss_mask"][0], [[0, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(arrays["lengths"][0], [4, 5])


def test_conversational_rows_use_the_chat_template():
    rows = [{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}] * 4
    data = preference_data({"train": rows, "validation": rows[:2]}, tokenizer="char",
                           config=PreferenceDataConfig(batch_size=2))  # fmt: skip
    assert data.format == "conversational" and data.counts == {"train": 4, "validation": 2}
    batch = data.train.batch(0)
    tokens, mask = batch["tokens"][0, 0], batch["loss_mask"][0, 0]
    answer = data.tokenizer.decode(tokens[mask == 1].tolist())
    start = int(np.argmax(mask))
    assert "It is blue." in answer and "sky" not in answer
    # the prompt is the conversation with the opening of the assistant's turn
    expected = encode_prompt(SKY, data.tokenizer, template=data.template)
    np.testing.assert_array_equal(tokens[:start], expected)


# An answer must be the assistant's: one or more assistant messages, each with text.
SYSTEM = {"role": "system", "content": "Be brief."}
NOT_THE_ASSISTANTS = [
    ([{"role": "user", "content": "It is blue."}], r"'chosen' holds the roles \['user'\]"),
    ([SYSTEM, *BLUE], r"'chosen' holds the roles \['system', 'assistant'\]"),
    (
        [{"role": "assistant", "content": ""}],
        r"'chosen': message 0 \(assistant\) has no text \(its content is empty text",
    ),
    (
        [*BLUE, {"role": "assistant", "content": None}],
        r"'chosen': message 1 \(assistant\) has no text \(its content is null",
    ),
]


@pytest.mark.parametrize(("chosen", "message"), NOT_THE_ASSISTANTS)
def test_an_answer_that_is_not_the_assistants_is_refused(chosen, message):
    rows = [{"prompt": SKY, "chosen": BLUE, "rejected": GREEN},
            {"prompt": SKY, "chosen": chosen, "rejected": GREEN}]  # fmt: skip
    with pytest.raises(DataError, match=f"preference row 1: {message}"):
        encode_rows(rows, build_tokenizer("char", ["abcdefghijklmnopqrstuvwxyz .?"]))


def test_an_implicit_answer_is_what_follows_the_shared_messages():
    user_again = [{"role": "user", "content": "And at night?"}]
    row = {"chosen": SKY + BLUE + user_again + BLUE, "rejected": SKY + BLUE + GREEN}
    with pytest.raises(
        DataError, match=r"row 0: 'chosen' \(after the messages both answers share\) holds the "
        r"roles \['user', 'assistant'\].*same in 'chosen' and 'rejected'"
    ):  # fmt: skip
        row_parts(row, 0)


CALL = {"role": "assistant", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "sky", "arguments": {}}}]}  # fmt: skip
RESULT = {"role": "tool", "content": "blue"}


def test_tool_turns_may_come_between_assistant_messages():
    row = {"prompt": SKY, "chosen": [CALL, RESULT, *BLUE], "rejected": GREEN}
    assert row_parts(row, 0)[1] == [CALL, RESULT, *BLUE]
    with pytest.raises(DataError, match=r"holds the roles \['assistant', 'tool'\]"):
        row_parts({**row, "chosen": [CALL, RESULT]}, 0)
    # a template that never renders tools refuses them with the row, not without a word
    tokenizer = build_tokenizer("char", ["abcdefghijklmnopqrstuvwxyz .?"])
    with pytest.raises(DataError, match=r"preference row 0: .*never mentions 'tool_calls'"):
        encode_rows([row], tokenizer)


def test_a_missing_null_or_mistyped_answer_names_its_column():
    """Before, each blamed the prompt: "'prompt' is list, expected text like the row's 'chosen'"."""
    with pytest.raises(DataError, match=r"row 2: .*missing \['chosen'\]"):
        row_parts({"prompt": SKY, "rejected": GREEN}, 2)
    for null in (None, float("nan")):
        with pytest.raises(DataError, match="row 2: 'chosen' is missing or null"):
            row_parts({"prompt": SKY, "chosen": null, "rejected": GREEN}, 2)
    with pytest.raises(
        DataError,
        match=r"row 2: 'chosen' holds text 'It is blue.', expected a list of messages like the "
        r"row's 'prompt'",
    ):
        row_parts({"prompt": SKY, "chosen": "It is blue.", "rejected": GREEN}, 2)
    with pytest.raises(
        DataError, match=r"row 2: 'rejected' holds a list \[\{'role'.*expected text"
    ):
        row_parts({"prompt": "Sky?", "chosen": "Blue.", "rejected": GREEN}, 2)


def test_a_row_without_an_answer_in_a_dataset_names_the_answer():
    """A datasets table fills a row's missing column with null: the error names that column."""
    from datasets import Dataset

    good = {"prompt": SKY, "chosen": BLUE, "rejected": GREEN}
    table = Dataset.from_list([good, good, {"prompt": SKY, "rejected": GREEN}])
    with pytest.raises(DataError, match="row 2: 'chosen' is missing or null"):
        preference_data(table, tokenizer="char")
