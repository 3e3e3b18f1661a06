"""See chat data as the model is trained on it: conversations with the trained tokens marked,
and what the lengths, the cut and the packing do to the data (`zoo train --show-data N`).

    from zoo.data.chat.preview import preview_chat_data
    print(preview_chat_data(load_spec("json:chats/"), tokenizer="word", count=3).text)

Each shown conversation is the chat template's rendering, token by token: the tokens the loss
counts are wrapped in `[[` and `]]` (green on a terminal, `color=True`), and a conversation cut
at `max_len + 1` tokens ends with a note. Control characters of the data (ESC, CR, U+202E, ...)
are shown as their escapes (`\\x1b`, `\\r`, `\\u202e`), never sent to the terminal. Below
come the length percentiles in tokens (before any cut), how many conversations were cut, how
many lost every trained token and are dropped, and how many rows the rest pack into.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

from zoo.data.chat.batches import ChatExamples, encode_conversations, pack_conversations
from zoo.data.chat.conversations import Conversation
from zoo.data.chat.datasets import chat_data, split_conversations
from zoo.data.chat.options import ChatDataConfig, resolve_train_on
from zoo.data.splits import AnyData
from zoo.data.tokenizers.base import Tokenizer
from zoo.text import printable

OPEN, CLOSE = "[[", "]]"  # around trained text, without color
GREEN, RESET = "\x1b[32m", "\x1b[0m"  # around trained text, with color


@dataclass(frozen=True)
class ChatPreview:
    """What `preview_chat_data` found; `text` is the report it prints."""

    text: str  # the shown conversations, the legend and the statistics
    conversations: int  # in the train split
    percentiles: dict[str, int]  # p50, p90, p99, max: tokens per conversation, before any cut
    truncated: int  # conversations longer than max_len + 1 tokens, cut
    dropped: int  # of those, the ones left without a trained token (not trained on)
    packed_rows: int | None  # rows the kept conversations pack into (None: unpacked)
    padding: float | None  # the share of padding in those rows (None: unpacked)


def preview_chat_data(
    dataset: AnyData,
    *,
    tokenizer: Tokenizer | str | None = None,
    config: ChatDataConfig | None = None,
    count: int = 3,
    color: bool = False,
) -> ChatPreview:
    """The first `count` train conversations of `dataset` as trained, and its statistics.

    `dataset`, `tokenizer` and `config` are those of `zoo.data.chat_data` (which reads them:
    the same template, tokenizer and loss mask); `color` marks the trained tokens with ANSI
    green instead of `[[ ]]`.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    config = config or ChatDataConfig()
    data = chat_data(dataset, tokenizer=tokenizer, config=config)
    rows = _train_conversations(dataset, config, data.format)
    train_on = resolve_train_on(config.train_on, data.format)
    examples = encode_conversations(rows, data.tokenizer, template=data.template,
                                    train_on=train_on, max_len=None,
                                    split=config.train_split)  # fmt: skip
    lengths = examples.tokens.lengths
    limit = config.max_len + 1
    shown = [
        render(examples.tokens.row(index), examples.loss_mask.row(index), data.tokenizer,
               limit=limit, color=color)
        for index in range(min(count, len(examples)))
    ]  # fmt: skip
    kept, truncated, dropped = _cut(examples, limit)
    percentiles = {f"p{q}": round(float(np.percentile(lengths, q))) for q in (50, 90, 99)}
    percentiles["max"] = int(lengths.max())
    packed_rows = padding = None
    if config.pack and kept:
        packed = pack_conversations(kept, max_len=config.max_len, pad_id=data.tokenizer.pad_id)
        packed_rows = len(packed["tokens"])
        padding = 1.0 - float((packed["segments"] > 0).mean())
    legend = (f"{GREEN}green{RESET}" if color else f"{OPEN}marked{CLOSE}") + " text is trained"
    lines = [f"--- conversation {index} ---\n{text}" for index, text in enumerate(shown)]
    lines.append(f"--- legend: {legend} (loss on {train_on} tokens); "
                 f"{data.format} format, {printable(data.template.origin)} ---")  # fmt: skip
    lines.append(_statistics(len(examples), percentiles, truncated, dropped, limit, kept,
                             packed_rows, padding))  # fmt: skip
    return ChatPreview("\n".join(lines), len(examples), percentiles, truncated, dropped,
                       packed_rows, padding)  # fmt: skip


def render(
    ids: npt.ArrayLike,
    mask: npt.ArrayLike,
    tokenizer: Tokenizer,
    *,
    limit: int,
    color: bool = False,
) -> str:
    """One conversation's text, its trained tokens marked (see the module doc); tokens past
    `limit` are left out and noted. Control characters of the text are shown escaped
    (`zoo.text.printable`): the data cannot move the cursor or clear the screen."""
    over = len(np.asarray(ids)) > limit
    ids, mask = np.asarray(ids)[:limit], np.asarray(mask)[:limit].copy()
    if len(mask):
        mask[0] = 0  # the first token is no target: nothing comes before it
    note = f"\n... (cut here: max_len + 1 = {limit} tokens)" if over else ""
    return marked(spans(ids, mask, tokenizer), color=color) + note


def spans(ids: npt.ArrayLike, mask: npt.ArrayLike, tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    """`(text, trained)` of each run of tokens the loss counts or not, in order: the decoded
    text of `ids` (special tokens spelt out), cut where `mask` changes."""
    ids, mask = np.asarray(ids), np.asarray(mask)
    start, prefix, found = 0, "", []
    for end in [*np.flatnonzero(np.diff(mask)) + 1, len(ids)]:
        text = tokenizer.decode(ids[:end], skip_special=False)
        piece = text[len(prefix) :] if text.startswith(prefix) else text
        prefix = text
        if piece:
            found.append((piece, bool(mask[start])))
        start = end
    return found


def marked(pieces: list[tuple[str, bool]], *, color: bool = False) -> str:
    """The pieces of `spans` joined, each control character escaped and the trained ones
    wrapped in `[[ ]]` (green with `color`), their leading whitespace left outside."""
    opened, closed = (GREEN, RESET) if color else (OPEN, CLOSE)
    shown = []
    for piece, trained in pieces:
        piece = printable(piece)
        if trained:
            lead = len(piece) - len(piece.lstrip())
            piece = f"{piece[:lead]}{opened}{piece[lead:]}{closed}"
        shown.append(piece)
    return "".join(shown)


def _cut(examples: ChatExamples, limit: int) -> tuple[ChatExamples | None, int, int]:
    """(the conversations as trained: cut to `limit`, those without a trained token dropped;
    how many were cut; how many dropped)."""
    from zoo.data.ragged import Ragged

    rows, masks, truncated, dropped = [], [], 0, 0
    for index in range(len(examples)):
        ids, mask = examples.tokens.row(index), examples.loss_mask.row(index)
        if len(ids) > limit:
            truncated += 1
            ids, mask = ids[:limit], mask[:limit]
            if not np.asarray(mask)[1:].any():
                dropped += 1
                continue
        rows.append(np.asarray(ids))
        masks.append(np.asarray(mask))
    if not rows:
        return None, truncated, dropped
    return ChatExamples(Ragged.from_rows(rows), Ragged.from_rows(masks)), truncated, dropped


def _statistics(
    conversations: int,
    percentiles: dict[str, int],
    truncated: int,
    dropped: int,
    limit: int,
    kept: ChatExamples | None,
    packed_rows: int | None,
    padding: float | None,
) -> str:
    shown = ", ".join(f"{name} {value}" for name, value in percentiles.items())
    lines = [
        f"lengths in tokens ({conversations} train conversations): {shown}",
        f"cut to {limit} tokens (max_len + 1): {truncated}; dropped (every trained token cut "
        f"away): {dropped}",
    ]
    if kept is not None:
        trained = kept.trained_tokens
        lines.append(f"trained tokens: {trained:,} of {kept.total_tokens:,} "
                     f"({trained / max(kept.total_tokens, 1):.1%})")  # fmt: skip
    if packed_rows is not None and kept is not None and padding is not None:
        lines.append(
            f"packed: {len(kept)} conversations into {packed_rows} rows of {limit} "
            f"tokens ({len(kept) / packed_rows:.2f} per row, {padding:.1%} padding)"
        )
    else:
        lines.append("one conversation per row (not packed)")
    return "\n".join(lines)


def _train_conversations(
    dataset: AnyData, config: ChatDataConfig, format: str
) -> list[Conversation]:
    """The train split's conversations, read as `chat_data` reads them."""
    split = dataset[config.train_split] if isinstance(dataset, Mapping) else dataset
    accepted = inspect.signature(split_conversations).parameters
    extra = {
        name: getattr(config, name)
        for name in ("roles", "messages_column", "config")
        if name in accepted and hasattr(config, name)
    }
    if "config" in accepted:
        extra["config"] = config
    return split_conversations(split, format=format, **extra)


__all__ = ["ChatPreview", "marked", "preview_chat_data", "render", "spans"]
