"""Conversations for instruction tuning: rows -> messages -> template -> ids and loss masks.

Read in this order:

- `conversations`: the row formats (messages, instruction/input/output, prompt/completion),
  detected from the columns, and the messages each row holds;
- `tools`: a row's `tools` column, and the refusal of templates that would drop tool calls;
- `template`: `ChatTemplate`, a Jinja chat template rendered in a sandbox, and the default one;
- `markers`: whether a tokenizer writes a template's markers (`<|im_start|>`) as one token;
- `files`: the template and special tokens a checkpoint or run folder carries;
- `tokens`: one conversation -> token ids and the assistant mask (`encode_chat`), a prompt for
  generation (`encode_prompt`), and the ids that end a turn;
- `turns`: where each assistant turn lies, read from the whole rendering of a template;
- `options`: `ChatDataConfig`, every option of `chat_data` and `chat_evaluation`;
- `batches`: many conversations -> packed, bucketed or padded batches (`chat_batches`);
- `datasets`: a dataset's splits -> train and validation batches (`chat_data`; it reads
  `datasets`, so it is imported on first use).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from zoo.data.chat.batches import ChatExamples, chat_batches, encode_conversations, trained_turns
from zoo.data.chat.conversations import (
    Conversation,
    conversation_messages,
    conversations,
    detect_format,
)
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.markers import MarkerReport, check_markers, template_marker_report
from zoo.data.chat.options import TRAIN_ON, ChatDataConfig, resolve_train_on
from zoo.data.chat.template import DEFAULT_TEMPLATE, ChatTemplate
from zoo.data.chat.tokens import ChatTokens, encode_chat, encode_prompt, end_of_turn_ids
from zoo.data.chat.tools import check_tool_support, row_tools
from zoo.data.chat.turns import TurnSpan, turn_spans

if TYPE_CHECKING:  # for type checkers, the names loaded on first use below
    from zoo.data.chat.datasets import ChatData as ChatData
    from zoo.data.chat.datasets import chat_data as chat_data

# Names whose module imports `datasets` (about a second): loaded when first asked for.
_LAZY = {"chat_data": "zoo.data.chat.datasets", "ChatData": "zoo.data.chat.datasets"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo.data.chat' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TEMPLATE",
    "TRAIN_ON",
    "ChatDataConfig",
    "ChatExamples",
    "ChatTemplate",
    "ChatTokens",
    "Conversation",
    "MarkerReport",
    "TurnSpan",
    "chat_batches",
    "chat_template_for",
    "check_markers",
    "check_tool_support",
    "conversation_messages",
    "conversations",
    "detect_format",
    "encode_chat",
    "encode_conversations",
    "encode_prompt",
    "end_of_turn_ids",
    "resolve_train_on",
    "row_tools",
    "template_marker_report",
    "trained_turns",
    "turn_spans",
    *_LAZY,
]
