"""Conversation and instruction rows -> one normalised list of `{role, content}` messages each.

| format | columns | becomes |
| --- | --- | --- |
| `messages` | `messages`: `[{role, content}, ...]` (the HF convention), or `conversations`: ShareGPT `[{from, value}, ...]` | the messages, ShareGPT's `human`/`gpt` read as `user`/`assistant` |
| `instruction` | `instruction`, optional `input`, `output`, optional `system` (Alpaca) | system turn, user turn (instruction, then the input after a blank line), assistant turn (output) |
| `prompt_completion` | `prompt`, `completion` (a text each, or TRL's conversational lists of messages) | user turn(s), then assistant turn(s) |

`detect_format(columns)` picks the format from the column names (in the order of the table);
an explicit `format=` overrides it. Roles are `system`, `user` and `assistant`; every content is
non-empty text; a training conversation has at least one assistant turn. A row that breaks
these gets a `DataError` (a `ValueError`) naming the row and what was expected.

- The instruction format's columns are read as text, as TRL and axolotl read them: a number is
  written as its text (`str(4)` is `"4"`), a list or a mapping is refused, and an empty (NaN)
  cell of a CSV is no value.
- A message may say whether it is trained: OpenAI's fine-tuning `weight` (0 or 1) or a
  `train` / `training` flag (true or false, axolotl's `message_field_training`). An assistant
  turn of weight 0 stays in the conversation, marked `"weight": 0` in its message, and the
  loss leaves it out (`zoo.data.chat.tokens.encode_chat`); any other value is refused, and so is
  a weight of 1 on a turn that is not the assistant's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

from zoo.data.errors import DataError

# {"role": "system" | "user" | "assistant", "content": text}, and "weight": 0 on an assistant
# turn that is not trained
Message: TypeAlias = dict[str, Any]

ROLES = ("system", "user", "assistant")
FORMATS = ("messages", "instruction", "prompt_completion")
# ShareGPT speaker names (`from`) -> roles; `human`/`gpt` are ShareGPT's own, the rest pass through.
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}
MESSAGE_COLUMNS = ("messages", "conversations")
# Keys of a message that say whether it is trained: OpenAI's weight (0/1), axolotl's flags.
WEIGHT_KEYS = ("weight", "train", "training")
EXPECTED = {
    "messages": "'messages' (or ShareGPT 'conversations')",
    "instruction": "'instruction' and 'output' (optional 'input', 'system')",
    "prompt_completion": "'prompt' and 'completion'",
}


def detect_format(columns: Iterable[str]) -> str | None:
    """The format the column names fit (see the module table), or None when none fits."""
    names = set(columns)
    if names & set(MESSAGE_COLUMNS):
        return "messages"
    if {"instruction", "output"} <= names:
        return "instruction"
    if {"prompt", "completion"} <= names:
        return "prompt_completion"
    return None


def conversation_messages(
    row: Mapping[str, Any],
    *,
    format: str | None = None,
    index: int = 0,
    require_assistant: bool = True,
) -> list[Message]:
    """The normalised messages of one row (`index` is its number, for error messages).

    `format` is one of `FORMATS`, or None to detect it from the row's columns.
    `require_assistant=False` accepts a conversation without an assistant turn (a prompt).
    """
    chosen = format if format is not None else detect_format(row)
    if chosen is None:
        raise DataError(
            f"row {index} fits no conversation format: expected the column(s) "
            f"{'; or '.join(EXPECTED.values())}; found {sorted(row)}"
        )
    if chosen not in FORMATS:
        raise ValueError(f"unknown conversation format {chosen!r}; use one of {FORMATS}")
    if chosen == "messages":
        messages = _from_messages(row, index)
    elif chosen == "instruction":
        messages = _from_instruction(row, index)
    else:
        messages = _from_prompt_completion(row, index)
    return check_messages(messages, index=index, require_assistant=require_assistant)


def conversations(
    rows: Iterable[Mapping[str, Any]],
    *,
    format: str | None = None,
    require_assistant: bool = True,
) -> Iterator[list[Message]]:
    """`conversation_messages` of every row, numbered from 0; the format is detected from the
    first row when not given, so every row is read the same way."""
    for index, row in enumerate(rows):
        if format is None:
            format = detect_format(row)
        yield conversation_messages(
            row, format=format, index=index, require_assistant=require_assistant
        )


def check_messages(
    messages: Sequence[Mapping[str, Any]],
    *,
    index: int = 0,
    require_assistant: bool = True,
    allow_empty_replies: bool = False,
) -> list[Message]:
    """`messages` as plain `{role, content}` dicts, or a `DataError` naming what is wrong.

    `allow_empty_replies` accepts an assistant turn with empty content (a model's reply that
    was nothing but its end of turn, kept in a chat's history)."""
    if not messages:
        raise DataError(f"row {index} holds an empty conversation (no messages)")
    checked: list[Message] = []
    for number, message in enumerate(messages):
        where = f"row {index}, message {number}"
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise DataError(
                f"{where} should be a mapping with 'role' and 'content', found {message!r}"
            )
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise DataError(f"{where} has the role {role!r}; roles are {ROLES}")
        if not isinstance(content, str):
            raise DataError(f"{where} ({role}) has {type(content).__name__} content, expected text")
        if not content.strip() and not (allow_empty_replies and role == "assistant"):
            raise DataError(f"{where} ({role}) has empty content; fill it or drop the row")
        weight = message_weight(message, where=where)
        if weight == 1 and role != "assistant":
            raise DataError(
                f"{where} ({role}) is marked trained (weight 1); only assistant turns are "
                "trained turn by turn: drop the mark from this turn, or train on every token "
                "(train_on='all')"
            )
        checked.append({"role": role, "content": content})
        if weight == 0 and role == "assistant":
            checked[-1]["weight"] = 0
    if require_assistant and all(message["role"] != "assistant" for message in checked):
        roles = [message["role"] for message in checked]
        raise DataError(
            f"row {index} has no assistant turn (its roles: {roles}): there is nothing to "
            "learn from it; drop the row (in Python, read it as a prompt with "
            "require_assistant=False)"
        )
    if require_assistant and all(
        message["role"] != "assistant" or message.get("weight") == 0 for message in checked
    ):
        raise DataError(
            f"row {index}: every assistant turn has weight 0 (or train false), so there is "
            "nothing to learn from it; give a turn weight 1, or drop the row"
        )
    return checked


def message_weight(message: Mapping[str, Any], *, where: str = "a message") -> int | None:
    """Whether `message` is trained: 0 or 1 from its `weight` (OpenAI's fine-tuning format) or
    its `train` / `training` flag (axolotl's); None when it carries none of them (a missing key
    and a null are the same). A value other than 0/1 or true/false, or marks that disagree, are
    a `DataError` naming `where`."""
    found: dict[str, int] = {}
    weight = message.get("weight")
    if weight is not None:
        number = isinstance(weight, int | float) and not isinstance(weight, bool)
        if not number or weight not in (0, 1):
            raise DataError(
                f"{where} has weight {weight!r}; a turn's weight is 0 (not trained) or 1 "
                "(trained): fix it or drop the row"
            )
        found["weight"] = int(weight)
    for key in WEIGHT_KEYS[1:]:
        flag = message.get(key)
        if flag is None:
            continue
        if not isinstance(flag, bool):
            raise DataError(
                f"{where} has {key}={flag!r}; the flag is true (trained) or false (not "
                "trained): fix it or drop the row"
            )
        found[key] = int(flag)
    if len(set(found.values())) > 1:
        raise DataError(
            f"{where} says both trained and not trained ({found}); keep one of the marks"
        )
    return next(iter(found.values()), None)


def _column(row: Mapping[str, Any], name: str, index: int, format: str) -> Any:
    if name not in row:
        raise DataError(
            f"row {index} lacks the column {name!r} of the {format!r} format: expected "
            f"{EXPECTED[format]}; found {sorted(row)}"
        )
    if _is_null(row[name]):
        raise DataError(
            f"row {index} has no value in {name!r} (null), which the {format!r} format needs; "
            "fill it or drop the row"
        )
    return row[name]


def _is_null(value: Any) -> bool:
    """None, or the NaN that stands for an empty cell of a CSV column of numbers."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _text(row: Mapping[str, Any], name: str, index: int, *, required: bool) -> str | None:
    """The instruction format's column `name` as text: a string as it is, a number as its
    text; None when it is absent or null (a `DataError` where it is `required`)."""
    if required:
        value = _column(row, name, index, "instruction")
    else:
        value = row.get(name)
        if _is_null(value):
            return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise DataError(
        f"row {index}: the column {name!r} holds {type(value).__name__} {_short(value)}, "
        "where the 'instruction' format expects text (a number is read as its text); write it "
        "as one string, or drop the row"
    )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _from_messages(row: Mapping[str, Any], index: int) -> list[Any]:
    present = [column for column in MESSAGE_COLUMNS if row.get(column) is not None]
    named = [column for column in MESSAGE_COLUMNS if column in row]
    name = present[0] if present else (named[0] if named else "messages")
    turns = _column(row, name, index, "messages")
    if isinstance(turns, str) or not isinstance(turns, Sequence):
        raise DataError(
            f"row {index}: column {name!r} should hold a list of messages, found "
            f"{type(turns).__name__}"
        )
    return [_sharegpt(turn, index, number) for number, turn in enumerate(turns)]


def _sharegpt(turn: Any, index: int, number: int) -> Any:
    """A ShareGPT `{from, value}` turn as `{role, content}`; any other turn as it is."""
    if not isinstance(turn, Mapping) or "role" in turn or "from" not in turn:
        return turn
    speaker = turn["from"]
    if speaker not in SHAREGPT_ROLES:
        raise DataError(
            f"row {index}, message {number} is from {speaker!r}; ShareGPT speakers are "
            f"{sorted(SHAREGPT_ROLES)}"
        )
    marks = {key: turn[key] for key in WEIGHT_KEYS if key in turn}
    return {"role": SHAREGPT_ROLES[speaker], "content": turn.get("value"), **marks}


def _from_instruction(row: Mapping[str, Any], index: int) -> list[Any]:
    instruction = _text(row, "instruction", index, required=True)
    output = _text(row, "output", index, required=True)
    request = instruction
    extra = _text(row, "input", index, required=False)
    if extra is not None and extra.strip():
        # Alpaca's own prompt puts the input in a section of its own, after the instruction.
        request = f"{instruction}\n\n{extra}"
    messages = [{"role": "user", "content": request}, {"role": "assistant", "content": output}]
    system = _text(row, "system", index, required=False)
    if system is not None and system.strip():
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _from_prompt_completion(row: Mapping[str, Any], index: int) -> list[Any]:
    prompt = _column(row, "prompt", index, "prompt_completion")
    completion = _column(row, "completion", index, "prompt_completion")
    turns = [
        _as_turns(prompt, "user", "prompt", index),
        _as_turns(completion, "assistant", "completion", index),
    ]
    return [*turns[0], *turns[1]]


def _as_turns(value: Any, role: str, column: str, index: int) -> list[Any]:
    """A text as one turn of `role`; a list (TRL's conversational form) as its messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Sequence):
        return list(value)
    raise DataError(
        f"row {index}: column {column!r} should hold text or a list of messages, found "
        f"{type(value).__name__}"
    )
