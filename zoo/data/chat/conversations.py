"""Conversation and instruction rows -> one normalised list of `{role, content}` messages each.

| format | columns | becomes |
| --- | --- | --- |
| `messages` | `messages`: `[{role, content}, ...]` (the HF convention), or `conversations`: ShareGPT `[{from, value}, ...]` | the messages, ShareGPT's `human`/`gpt` read as `user`/`assistant` |
| `instruction` | `instruction`, optional `input`, `output`, optional `system` (Alpaca) | system turn, user turn (instruction, then the input after a blank line), assistant turn (output) |
| `prompt_completion` | `prompt`, `completion` (a text each, or TRL's conversational lists of messages) | user turn(s), then assistant turn(s) |

`detect_format(columns)` picks the format from the column names (in the order of the table);
an explicit `format=` overrides it; `messages_column=` names another column of messages, and
`roles=` maps other speaker names onto the roles (`{"human": "user", "bot": "assistant"}`).
Roles are `system`, `user`, `assistant` and `tool`; every content is non-empty text, but for an
assistant turn that calls tools (`tool_calls`, its content may be empty or null); a training
conversation has at least one assistant turn. A row that breaks these, or that is written in
another format than the rows before it, gets a `DataError` (a `ValueError`) naming the row and
what was expected.

Each row becomes a `Conversation`: a list of messages that also carries the row's `tools` (a
`tools` column: a list of JSON function schemas, or that list as a JSON string; the template
renders them, as transformers' `apply_chat_template(tools=...)` does) and, for
prompt/completion rows, where the completion starts (`completion_start`).

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
from typing import Literal, NotRequired, TypedDict

from zoo.data.chat.tools import row_tools, without_nulls
from zoo.data.errors import DataError

ToolKey = Literal["tool_calls", "tool_call_id", "name"]


class Message(TypedDict):
    """One checked message, as the template reads it."""

    role: str  # one of ROLES
    content: str | None  # text; None (or "") only on an assistant turn that calls tools
    weight: NotRequired[int]  # 0 on an assistant turn that is not trained
    # an assistant turn's calls, a tool turn's answer to one: as the row wrote them
    tool_calls: NotRequired[object]
    tool_call_id: NotRequired[object]
    name: NotRequired[object]


ROLES = ("system", "user", "assistant", "tool")
# Keys of an assistant or tool message that reach the template besides role and content.
TOOL_KEYS: tuple[ToolKey, ...] = ("tool_calls", "tool_call_id", "name")
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


class Conversation(list[Message]):
    """A conversation's messages (a list), with the row's `tools` (None: none) and, for a
    prompt/completion row, the index of its first completion message (`completion_start`)."""

    tools: list[dict[str, object]] | None = None
    completion_start: int | None = None


def check_roles(roles: Mapping[str, str]) -> dict[str, str]:
    """`roles` (speaker name -> role) checked: every target one of `ROLES`."""
    if not isinstance(roles, Mapping):
        raise ValueError(
            f"roles should map speaker names to roles (e.g. {{'human': 'user'}}), found "
            f"{type(roles).__name__}"
        )
    checked = {}
    for name, role in roles.items():
        if not isinstance(name, str) or not name or role not in ROLES:
            raise ValueError(
                f"roles maps {name!r} to {role!r}; each speaker name maps to one of {ROLES} "
                "(e.g. human=user, gpt=assistant)"
            )
        checked[name] = role
    return checked


def detect_format(columns: Iterable[str], *, messages_column: str | None = None) -> str | None:
    """The format the column names fit (see the module table), or None when none fits;
    `messages_column` is a column of messages under another name."""
    names = set(columns)
    if messages_column is not None and messages_column in names:
        return "messages"
    if names & set(MESSAGE_COLUMNS):
        return "messages"
    if {"instruction", "output"} <= names:
        return "instruction"
    if {"prompt", "completion"} <= names:
        return "prompt_completion"
    return None


def conversation_messages(
    row: Mapping[str, object],
    *,
    format: str | None = None,
    index: int = 0,
    require_assistant: bool = True,
    roles: Mapping[str, str] | None = None,
    messages_column: str | None = None,
    detected: bool = False,
) -> Conversation:
    """The normalised messages of one row, as a `Conversation` (with the row's tools).

    Args:
        row: the row, a mapping of column names to values.
        format: one of `FORMATS`, or None to detect it from the row's columns.
        index: the row's number, for error messages.
        require_assistant: False accepts a conversation without an assistant turn (a prompt).
        roles: speaker names -> roles (`{"human": "user"}`), for `role` and ShareGPT `from`.
        messages_column: the column of messages; None: `messages` or `conversations`.
        detected: `format` was read from the data (its first row or its columns), so a row of
            another format is named as one of rows that mix formats.
    """
    chosen = format if format is not None else detect_format(row, messages_column=messages_column)
    if chosen is None:
        raise DataError(
            f"row {index} fits no conversation format: expected the column(s) "
            f"{'; or '.join(EXPECTED.values())}; found {sorted(row)}"
        )
    if chosen not in FORMATS:
        raise ValueError(f"unknown conversation format {chosen!r}; use one of {FORMATS}")
    if detected:
        _check_not_mixed(row, chosen, index, messages_column)
    completion_start = None
    messages: Sequence[object]
    if chosen == "messages":
        messages = _from_messages(row, index, messages_column, roles)
    elif chosen == "instruction":
        messages = _from_instruction(row, index)
    else:
        messages, completion_start = _from_prompt_completion(row, index)
    if roles and chosen != "messages":
        messages = [_renamed(turn, roles) for turn in messages]
    conversation = Conversation(
        check_messages(messages, index=index, require_assistant=require_assistant)
    )
    conversation.tools = row_tools(row, index)
    conversation.completion_start = completion_start
    return conversation


def conversations(
    rows: Iterable[Mapping[str, object]],
    *,
    format: str | None = None,
    require_assistant: bool = True,
    roles: Mapping[str, str] | None = None,
    messages_column: str | None = None,
) -> Iterator[Conversation]:
    """`conversation_messages` of every row, numbered from 0; the format is detected from the
    first row when not given, so every row is read the same way."""
    detected = format is None
    for index, row in enumerate(rows):
        if format is None:
            format = detect_format(row, messages_column=messages_column)
        yield conversation_messages(
            row, format=format, index=index, require_assistant=require_assistant, roles=roles,
            messages_column=messages_column, detected=detected,
        )  # fmt: skip


def _check_not_mixed(
    row: Mapping[str, object], chosen: str, index: int, messages_column: str | None
) -> None:
    """A `DataError` when the row is written in another format than `chosen` (the format of
    the data, read from its first row or its columns): its own columns fit that other format
    and those of `chosen` are absent or null."""
    filled = [name for name, value in row.items() if not _is_null(value)]
    own = detect_format(filled, messages_column=messages_column)
    needed = {
        "messages": [messages_column] if messages_column else list(MESSAGE_COLUMNS),
        "instruction": ["instruction", "output"],
        "prompt_completion": ["prompt", "completion"],
    }[chosen]
    lacking = (
        all(name not in filled for name in needed)
        if chosen == "messages"
        else any(name not in filled for name in needed)
    )
    if own is not None and own != chosen and lacking:
        raise DataError(
            f"row {index} is a {own!r} row (columns {sorted(filled)}) where the data is read "
            f"as {chosen!r} rows: the rows mix the formats {chosen!r} and {own!r}; write every "
            "row in one format, or split the data by format"
        )


def _renamed(turn: object, roles: Mapping[str, str]) -> object:
    """A message whose role (or ShareGPT speaker) `roles` names, with the role it maps to."""
    if not isinstance(turn, Mapping):
        return turn
    for key in ("role", "from"):
        speaker = turn.get(key)
        if isinstance(speaker, str) and speaker in roles:
            renamed = {name: value for name, value in turn.items() if name != "from"}
            if key == "from":
                renamed["content"] = turn.get("value")
                renamed.pop("value", None)
            return {**renamed, "role": roles[speaker]}
    return turn


def check_messages(
    messages: Sequence[object],
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
        if not isinstance(role, str) or role not in ROLES:
            raise DataError(
                f"{where} has the role {role!r}; roles are {ROLES} (name others with --role "
                "FROM=TO, roles={FROM: TO})"
            )
        calls = message.get("tool_calls")
        if role == "assistant" and calls is not None:
            if not isinstance(calls, Sequence) or isinstance(calls, str) or not calls:
                raise DataError(
                    f"{where} (assistant) has tool_calls {_short(calls)}; expected a non-empty "
                    "list of calls ({'type': 'function', 'function': {'name', 'arguments'}})"
                )
        elif calls is not None:
            raise DataError(f"{where} ({role}) has tool_calls; only an assistant turn calls tools")
        only_calls = content is None and calls is not None  # a turn that only calls tools
        if not only_calls and not isinstance(content, str):
            raise DataError(f"{where} ({role}) has {type(content).__name__} content, expected text")
        may_be_empty = calls is not None or (allow_empty_replies and role == "assistant")
        if not only_calls and not content.strip() and not may_be_empty:
            raise DataError(f"{where} ({role}) has empty content; fill it or drop the row")
        weight = message_weight(message, where=where)
        if weight == 1 and role != "assistant":
            raise DataError(
                f"{where} ({role}) is marked trained (weight 1); only assistant turns are "
                "trained turn by turn: drop the mark from this turn, or train on every token "
                "(--train-on all, train_on='all')"
            )
        entry: Message = {"role": role, "content": content}
        for key in TOOL_KEYS if role in ("assistant", "tool") else ():
            if message.get(key) is not None:
                entry[key] = without_nulls(message[key])
        if weight == 0 and role == "assistant":
            entry["weight"] = 0
        checked.append(entry)
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


def message_weight(message: Mapping[str, object], *, where: str = "a message") -> int | None:
    """Whether `message` is trained: 0 or 1 from its `weight` (OpenAI's fine-tuning format) or
    its `train` / `training` flag (axolotl's); None when it carries none of them (a missing key
    and a null are the same). A value other than 0/1 or true/false, or marks that disagree, are
    a `DataError` naming `where`."""
    found: dict[str, int] = {}
    weight = message.get("weight")
    if weight is not None:
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight not in (0, 1):
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


def _column(row: Mapping[str, object], name: str, index: int, format: str) -> object:
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


def _is_null(value: object) -> bool:
    """None, or the NaN that stands for an empty cell of a CSV column of numbers."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _text(row: Mapping[str, object], name: str, index: int, *, required: bool) -> str | None:
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


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _from_messages(
    row: Mapping[str, object],
    index: int,
    column: str | None = None,
    roles: Mapping[str, str] | None = None,
) -> list[object]:
    if column is not None:
        if column not in row:
            raise DataError(
                f"row {index} has no column {column!r} (the messages column asked for); its "
                f"columns are {sorted(row)}"
            )
        name = column
    else:
        present = [column for column in MESSAGE_COLUMNS if row.get(column) is not None]
        named = [column for column in MESSAGE_COLUMNS if column in row]
        name = present[0] if present else (named[0] if named else "messages")
    turns = _column(row, name, index, "messages")
    if isinstance(turns, str) or not isinstance(turns, Sequence):
        raise DataError(
            f"row {index}: column {name!r} should hold a list of messages, found "
            f"{type(turns).__name__}"
        )
    if roles:
        turns = [_renamed(turn, roles) for turn in turns]
    return [_sharegpt(turn, index, number) for number, turn in enumerate(turns)]


def _sharegpt(turn: object, index: int, number: int) -> object:
    """A ShareGPT `{from, value}` turn as `{role, content}`; any other turn as it is."""
    if not isinstance(turn, Mapping) or turn.get("role") is not None or "from" not in turn:
        return turn
    speaker = turn["from"]
    if speaker not in SHAREGPT_ROLES:
        raise DataError(
            f"row {index}, message {number} is from {speaker!r}; ShareGPT speakers are "
            f"{sorted(SHAREGPT_ROLES)}: map other names onto roles (--role {speaker}=user, "
            f"roles={{{speaker!r}: 'user'}})"
        )
    marks = {key: turn[key] for key in (*WEIGHT_KEYS, *TOOL_KEYS) if key in turn}
    return {"role": SHAREGPT_ROLES[speaker], "content": turn.get("value"), **marks}


def _from_instruction(row: Mapping[str, object], index: int) -> list[dict[str, str | None]]:
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


def _from_prompt_completion(row: Mapping[str, object], index: int) -> tuple[list[object], int]:
    """The prompt's and the completion's messages, and the index of the completion's first."""
    prompt = _column(row, "prompt", index, "prompt_completion")
    completion = _column(row, "completion", index, "prompt_completion")
    asked = _as_turns(prompt, "user", "prompt", index)
    answered = _as_turns(completion, "assistant", "completion", index)
    return [*asked, *answered], len(asked)


def _as_turns(value: object, role: str, column: str, index: int) -> list[object]:
    """A text as one turn of `role`; a list (TRL's conversational form) as its messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Sequence):
        return list(value)
    raise DataError(
        f"row {index}: column {column!r} should hold text or a list of messages, found "
        f"{type(value).__name__}"
    )
