"""Tool calling in conversations: a row's `tools` column, and templates that would drop tools.

A row may carry the functions its assistant can call in a `tools` column: a list of JSON
function schemas (`{"type": "function", "function": {"name", "description", "parameters"}}`),
or that list written as one JSON string (how TRL and most hub datasets store it, since a
dataset's columns fill every mapping with the keys of all the others, as nulls). The template
gets them as `tools=`, as transformers' `apply_chat_template(tools=...)` passes them.

Assistant turns that call tools carry `tool_calls` (and may have empty or null content); the
results come back in `tool` turns. A template that never mentions them is refused
(`check_tool_support`) rather than left to drop them from the text without a word.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Sized

from zoo.data.chat.template import ChatTemplate
from zoo.data.errors import DataError
from zoo.files import MAX_JSON_DEPTH, json_depth

TOOLS_COLUMN = "tools"
TOO_DEEP = object()  # stands for JSON nested past Python's recursion limit


def _is_null(value: object) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def row_tools(row: Mapping[str, object], index: int = 0) -> list[dict[str, object]] | None:
    """The row's `tools` column: a list of function schemas (mappings), or that list written
    as a JSON string; None when the row has none (absent, null or empty)."""
    value = row.get(TOOLS_COLUMN)
    if _is_null(value) or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise DataError(
                f"row {index}: the column 'tools' holds text that is not JSON ({error.msg} at "
                f"character {error.pos}); write a JSON list of function schemas"
            ) from None
        except RecursionError:
            value = TOO_DEEP  # nested past any depth a schema has: refused below
        if value is None:
            return None
        if value is TOO_DEEP or json_depth(value) > MAX_JSON_DEPTH:
            raise DataError(
                f"row {index}: the column 'tools' nests deeper than {MAX_JSON_DEPTH} levels; a "
                "function schema is a few levels deep: fix or drop the row"
            )
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or not all(isinstance(tool, Mapping) for tool in value)
    ):
        raise DataError(
            f"row {index}: the column 'tools' should hold a list of function schemas "
            f"(mappings, or a JSON string of them), found {_short(value)}"
        )
    return [schema_without_nulls(tool) for tool in value] or None


def without_nulls(value: object) -> object:
    """`value` without the null entries a dataset's columns add to mappings that lack a key."""
    if isinstance(value, Mapping):
        return schema_without_nulls(value)
    if isinstance(value, list | tuple):
        return [without_nulls(item) for item in value]
    return value


def schema_without_nulls(schema: Mapping[str, object]) -> dict[str, object]:
    """A mapping (a function schema, a tool call) as a dict, `without_nulls` all through."""
    return {key: without_nulls(item) for key, item in schema.items() if item is not None}


def check_tool_support(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    tools: Sized | None = None,
) -> None:
    """A `ValueError` when the conversation has tools, tool calls or tool turns and `template`
    never mentions them (it would leave them out of the text without a word)."""
    needs = []
    if tools:
        needs.append(("tools", f"{len(tools)} tool schema(s) (the 'tools' column)"))
    calls = sum(1 for message in messages if message.get("tool_calls"))
    if calls:
        needs.append(("tool_calls", f"{calls} assistant turn(s) with tool_calls"))
    results = sum(1 for message in messages if message.get("role") == "tool")
    if results:
        needs.append(("tool", f"{results} tool turn(s)"))
    for word, what in needs:
        if word not in template.source:
            raise ValueError(
                f"{template.origin} never mentions {word!r}, and the conversation has {what}: "
                "the template would leave them out; pass a template that renders tool calling "
                "(--template FILE, template=...), or drop the tools from the data"
            )


__all__ = [
    "TOOLS_COLUMN",
    "check_tool_support",
    "row_tools",
    "schema_without_nulls",
    "without_nulls",
]
