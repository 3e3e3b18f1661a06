"""Preference rows checked: their format told from the columns, the implicit prompt split off,
and each answer the assistant's.

A row's `prompt` decides its kind (its `chosen` where there is no prompt): text (standard) or
a list of messages (conversational); the other columns must hold the same. An answer given as
messages is the assistant's: it opens and closes with an assistant message, with tool turns at
most between them, and each message has text. A missing, null or mistyped column, or an answer
that is not the assistant's, is a `DataError` naming the row, the column and what it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias, TypeVar

from zoo.data.errors import DataError

ANSWERS = ("chosen", "rejected")
MARGIN = "margin"  # an optional column: how much better chosen is (a reward model's margin)
# A conversational row's prompt or answer: its messages.
Turns: TypeAlias = list[Mapping[str, object]]
# A checked row (`row_parts`): prompt, chosen and rejected, three texts or three lists of turns.
Parts: TypeAlias = tuple[str, str, str] | tuple[Turns, Turns, Turns]
Side = TypeVar("Side", str, Turns)


def preference_format(row: Mapping[str, object], index: int = 0) -> tuple[str, bool]:
    """`(kind, implicit)` of row `index`: "standard" (text) or "conversational" (messages), as
    its `prompt` holds (its `chosen` where there is no prompt), and whether the prompt is implicit
    (no `prompt` column); a `DataError` naming the column for a missing or null one."""
    missing = [name for name in ANSWERS if name not in row]
    if missing:
        raise DataError(
            f"preference row {index}: preference rows need 'chosen' and 'rejected' columns (and "
            f"optionally 'prompt'); missing {missing} among the columns {sorted(row)}"
        )
    for name in (*(("prompt",) if "prompt" in row else ()), *ANSWERS):
        if _is_null(row[name]):
            raise DataError(
                f"preference row {index}: {name!r} is missing or null; every pair needs a prompt "
                "and both answers: fill it or drop the row"
            )
    decider = "prompt" if "prompt" in row else "chosen"
    kind = "conversational" if isinstance(row[decider], list | tuple) else "standard"
    return kind, "prompt" not in row


def split_prompt(chosen: Side, rejected: Side) -> tuple[Side, Side, Side]:
    """`(prompt, chosen, rejected)` of an implicit-prompt row: the prompt is the leading part
    (messages, or characters) both answers share; a space before the split stays with them."""
    shared = 0
    for left, right in zip(chosen, rejected, strict=False):
        if left != right:
            break
        shared += 1
    if isinstance(chosen, str) and 0 < shared < len(chosen) and chosen[shared - 1] == " ":
        shared -= 1
    return chosen[:shared], chosen[shared:], rejected[shared:]


def row_parts(row: Mapping[str, object], index: int) -> Parts:
    """`(prompt, chosen, rejected)` of row `index`, checked (see the module doc): every column
    of the kind its prompt has (text or messages), and each answer the assistant's
    (`check_answer`)."""
    kind, implicit = preference_format(row, index)
    parts: Parts
    if kind == "conversational":
        parts = _sides(row, index, implicit, _turns)
    else:
        parts = _sides(row, index, implicit, _text)
    where = " after the prompt the answers share" if implicit else ""
    for name, value in zip(ANSWERS, parts[1:], strict=True):
        if not value or (isinstance(value, str) and not value.strip()):
            raise DataError(f"preference row {index}: the {name!r} answer is empty{where}")
        if isinstance(value, list):
            check_answer(value, name, index, implicit=implicit)
    if parts[1] == parts[2]:
        raise DataError(
            f"preference row {index}: 'chosen' and 'rejected' are identical; a pair needs two "
            "different answers"
        )
    return parts


def check_answer(turns: Turns, name: str, index: int, *, implicit: bool = False) -> None:
    """A `DataError` unless `turns` (the `name` answer of row `index`) is the assistant's: it
    opens and closes with an assistant message, has tool turns at most between them (where the
    template renders tools), and every message has text (an assistant's may only call tools)."""
    where = f"preference row {index}: {name!r}"
    where += " (after the messages both answers share)" if implicit else ""
    roles = [message.get("role") for message in turns]
    if roles[0] != "assistant" or roles[-1] != "assistant" or set(roles) - {"assistant", "tool"}:
        move = (
            "the turns before the answer must be the same in 'chosen' and 'rejected'"
            if implicit
            else "the other turns belong in 'prompt'"
        )
        raise DataError(
            f"{where} holds the roles {roles}; an answer is the assistant's: one or more "
            f"assistant messages (tool turns between them): {move}"
        )
    for number, message in enumerate(turns):
        content = message.get("content")
        if message.get("role") == "assistant" and message.get("tool_calls"):
            continue  # a turn that calls tools may say nothing
        if not isinstance(content, str) or not content.strip():
            raise DataError(
                f"{where}: message {number} ({message.get('role')}) has no text (its content is "
                f"{_holding(content)}); an answer's messages need text: fill it or drop the row"
            )


def _sides(
    row: Mapping[str, object],
    index: int,
    implicit: bool,
    read: Callable[[object, str, int, str], Side],
) -> tuple[Side, Side, Side]:
    """`(prompt, chosen, rejected)`, each column read (and checked) by `read`; an implicit
    prompt is the start the answers share (`split_prompt`)."""
    decider = "chosen" if implicit else "prompt"
    prompt = None if implicit else read(row["prompt"], "prompt", index, decider)
    chosen, rejected = (read(row[name], name, index, decider) for name in ANSWERS)
    if prompt is None:
        return split_prompt(chosen, rejected)
    return prompt, chosen, rejected


def _text(value: object, name: str, index: int, decider: str) -> str:
    """A standard row's column: text (as the row's `decider` column holds)."""
    if not isinstance(value, str):
        raise DataError(
            f"preference row {index}: {name!r} holds {_holding(value)}, expected text like the "
            f"row's {decider!r}"
        )
    return value


def _turns(value: object, name: str, index: int, decider: str) -> Turns:
    """A conversational row's column: a list of messages (mappings), as `decider` holds."""
    if not isinstance(value, list | tuple):
        raise DataError(
            f"preference row {index}: {name!r} holds {_holding(value)}, expected a list of "
            f"messages like the row's {decider!r}"
        )
    turns = []
    for number, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise DataError(
                f"preference row {index}: message {number} of {name!r} is "
                f"{type(message).__name__}, expected a mapping with 'role' and 'content'"
            )
        turns.append(message)
    return turns


def row_margins(rows: Sequence[Mapping[str, object]]) -> list[float | None]:
    """Each row's `margin` (None where the rows have no such column): a finite number on every
    row, or a `DataError` naming the row."""
    if not any(MARGIN in row for row in rows):
        return [None] * len(rows)
    margins: list[float | None] = []
    for index, row in enumerate(rows):
        value = row.get(MARGIN)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise DataError(
                f"preference row {index}: {MARGIN!r} holds {_holding(value)}; a margin is a "
                "finite number on every row (or no row has the column)"
            )
        margins.append(float(value))
    return margins


def _is_null(value: object) -> bool:
    """None, or the NaN of an empty cell in a column of numbers."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _holding(value: object, limit: int = 40) -> str:
    """What a cell holds, for an error: its kind and the start of it."""
    if value is None:
        return "null"
    shown = repr(value) if len(repr(value)) <= limit else f"{repr(value)[: limit - 3]}..."
    if isinstance(value, str):
        return f"text {shown}" if value.strip() else f"empty text {shown}"
    if isinstance(value, list | tuple):
        return f"a list {shown}"
    return f"{type(value).__name__} {shown}"
