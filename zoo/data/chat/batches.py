"""Conversations -> token ids and loss masks -> packed or padded language-modelling batches.

Each conversation is rendered through the model's chat template and tokenized
(`zoo.data.chat.tokens.encode_chat`); its `loss_mask` is 1 on the tokens trained as targets:
the assistant's (`train_on="assistant"`: each assistant turn's content and its end-of-turn
token, but for the turns of weight 0), the completion's (`"completion"`: the assistant turns
of a prompt/completion row's completion, not those its prompt holds), the final reply's
(`"last"`), or every token (`"all"`, weights aside, as axolotl's `train_on_inputs`). `"auto"`,
the default, is `completion` for prompt/completion rows and `assistant` otherwise. A row's
`tools` (`Conversation.tools`) reach the template. The batches are those of
`zoo.tasks.LanguageModeling`:

| batch key | shape | holds |
| --- | --- | --- |
| `tokens` | `[batch, width]` | the model reads `tokens[:, :-1]` and predicts `tokens[:, 1:]` |
| `loss_mask` | `[batch, width]` | 1 where the token is scored as a target; 0 on padding |
| `segments` | `[batch, width]` | packed only: conversation number in the row (1, 2, ...), 0 on padding |
| `loss_positions` | `[batch, capacity]` | the scored target positions, then -1, where they are few (`zoo.data.positions`) |

Packed (the default), conversations are placed whole into rows of `max_len + 1` tokens, best
fit, longest first; each attends only to itself, with positions from 0 (`GPT(tokens,
segments=...)`), so a packed row trains as its conversations would one by one. Unpacked, each
conversation is a row of its own, padded to a bucket length (as other data is, see
`zoo.data.BucketedBatches`). A conversation longer than `max_len + 1` tokens is cut (and
counted in the log), or refused with `truncate=False`; one whose trained tokens were all cut
away is dropped, since nothing of it would be learnt.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.data.batches import ArrayBatches, BatchSource
from zoo.data.bucketing import batches_of, lengths_to_fit
from zoo.data.chat.options import TRAIN_ON, ChatDataConfig
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat
from zoo.data.errors import DataError
from zoo.data.options import resolve_buckets
from zoo.data.positions import (
    LOSS_POSITIONS,
    ListedPositions,
    capacity_for,
    largest_count,
    loss_positions,
)
from zoo.data.ragged import Ragged
from zoo.data.tokenizers.base import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatExamples:
    """Tokenized conversations: the ids of each and its 0/1 mask of trained targets."""

    tokens: Ragged
    loss_mask: Ragged

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def total_tokens(self) -> int:
        """Tokens in every conversation (padding aside)."""
        return len(self.tokens.flat)

    @property
    def trained_tokens(self) -> int:
        """Tokens scored as targets (the assistant's, with `train_on="assistant"`).

        A conversation's first token is never a target (nothing comes before it to predict it
        from), so with `train_on="all"` this counts `total_tokens - len(self)`.
        """
        starts = self.loss_mask.offsets[:-1]
        first = self.loss_mask.flat[starts[self.loss_mask.lengths > 0]]
        return int(self.loss_mask.flat.sum() - first.sum())

    @property
    def most_trained(self) -> int:
        """The most targets any one conversation scores (its first token is never one)."""
        flat = np.asarray(self.loss_mask.flat) != 0
        offsets = self.loss_mask.offsets
        running = np.concatenate([[0], np.cumsum(flat)])
        per_row = running[offsets[1:]] - running[offsets[:-1]]
        nonempty = offsets[1:] > offsets[:-1]
        first = np.zeros(len(per_row), np.int64)
        first[nonempty] = flat[offsets[:-1][nonempty]]
        return int((per_row - first).max(initial=0))


def encode_conversations(
    conversations: Iterable[Sequence[Mapping[str, Any]]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    train_on: str = "auto",
    max_len: int | None = None,
    truncate: bool = True,
    split: str = "train",
    **variables: Any,
) -> ChatExamples:
    """The conversations as token ids and loss masks (see the module doc).

    Args:
        conversations: each a sequence of messages (`{"role", "content"}` mappings).
        tokenizer: the model's tokenizer.
        template: the chat template; None: `chat_template_for(tokenizer)` (`encode_chat`).
        train_on: the tokens the loss counts (`trained_turns`): `assistant`, `completion`,
            `last`, `all`, or `auto` (the completion where a conversation has one, else
            the assistant's).
        max_len: the longest sequence the model reads: a conversation keeps at most
            `max_len + 1` tokens (the last one is only a target); None: no limit.
        truncate: cut a longer conversation (and log it); False raises a `DataError`.
        split: the data's name in messages.
        **variables: passed to the template as it renders.
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
    tools = variables.pop("tools", None)
    limit = None if max_len is None else max_len + 1
    rows: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    cut = dropped = 0
    for index, messages in enumerate(conversations):
        own_tools = getattr(messages, "tools", None) or tools
        extra = {**variables, "tools": own_tools} if own_tools else variables
        chat = encode_chat(
            trained_turns(messages, train_on, index=index, split=split), tokenizer,
            template=template, read_turns=train_on != "all", **extra,
        )  # fmt: skip
        ids, mask = chat.input_ids, chat.assistant_mask
        if train_on != "all" and not mask[1:].any():
            raise DataError(
                f"{split} conversation {index} has no assistant token to train on (roles "
                f"{[message.get('role') for message in messages]}); the template wrote no "
                "assistant turn for it, or each assistant turn it trains has weight 0"
            )
        if limit is not None and len(ids) > limit:
            if not truncate:
                raise DataError(
                    f"{split} conversation {index} has {len(ids)} tokens; the model reads at "
                    f"most max_len={max_len} (+1 target): raise it (--max-len, max_len), "
                    "shorten the conversation, or let long ones be cut (truncate=True)"
                )
            ids, mask, cut = ids[:limit], mask[:limit], cut + 1
            if not mask[1:].any():
                dropped += 1
                continue
        rows.append(ids)
        masks.append(mask)
    if cut:
        logger.warning(
            "%d of %d %s conversations are longer than %d tokens and were cut; %d of them "
            "lost every trained token and were dropped (raise max_len to keep them whole)",
            cut, len(rows) + dropped, split, limit, dropped,
        )  # fmt: skip
    if not rows:
        raise DataError(f"the {split} split holds no conversation to train on")
    return ChatExamples(Ragged.from_rows(rows), Ragged.from_rows(masks))


def trained_turns(
    messages: Sequence[Mapping[str, Any]], train_on: str, *, index: int = 0, split: str = "train"
) -> list[Mapping[str, Any]]:
    """`messages` with weight 0 on the assistant turns `train_on` leaves out of the loss:
    `completion` those before the completion (`Conversation.completion_start`), `last` all but
    the final one; `assistant` and `all` leave the messages as they are (`auto` is
    `completion` for a conversation with a completion, else `assistant`)."""
    start: int | None = getattr(messages, "completion_start", None)
    if train_on == "auto":
        train_on = "completion" if start is not None else "assistant"
    if train_on == "completion" and start is None:
        raise DataError(
            f"{split} conversation {index} has no completion: training on the completion "
            "(--train-on completion, train_on='completion') reads prompt/completion rows; "
            "train on assistant, last or all"
        )
    if train_on == "completion" and start is not None:
        keep = set(range(start, len(messages)))
    elif train_on == "last":
        turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
        keep = set(turns[-1:])
    else:
        return list(messages)
    return [
        {**message, "weight": 0}
        if message.get("role") == "assistant" and number not in keep
        else message
        for number, message in enumerate(messages)
    ]


def pack_conversations(
    examples: ChatExamples, *, max_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    """`tokens`, `loss_mask` and `segments`, each `int32[rows, max_len + 1]`: the
    conversations placed whole into rows, best fit, longest first (see the module doc)."""
    width = max_len + 1
    lengths = examples.tokens.lengths
    if lengths.max() > width:
        raise DataError(
            f"a conversation has {int(lengths.max())} tokens, more than a packed row of "
            f"{width} (max_len + 1); encode with the same max_len"
        )
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (space left, row number), sorted
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = int(lengths[index])
        slot = bisect.bisect_left(room, (length, -1))
        if slot == len(room):
            rows.append([index])
            bisect.insort(room, (width - length, len(rows) - 1))
            continue
        left, row = room.pop(slot)
        rows[row].append(index)
        bisect.insort(room, (left - length, row))
    shape = (len(rows), width)
    tokens = np.full(shape, pad_id, np.int32)
    loss_mask = np.zeros(shape, np.int32)
    segments = np.zeros(shape, np.int32)
    for row, members in enumerate(rows):
        start = 0
        for number, index in enumerate(members, start=1):
            ids = examples.tokens.row(index)
            end = start + len(ids)
            tokens[row, start:end] = ids
            loss_mask[row, start:end] = examples.loss_mask.row(index)
            segments[row, start:end] = number
            start = end
    return {"tokens": tokens, "loss_mask": loss_mask, "segments": segments}


def chat_batches(
    examples: ChatExamples,
    *,
    pad_id: int,
    config: ChatDataConfig | None = None,
    shuffle: bool = True,
    drop_last: bool = True,
    split: str = "train",
) -> BatchSource:
    """Batches of the conversations for `zoo.tasks.LanguageModeling` (see the module doc).

    Packed: rows of `max_len + 1` tokens. Unpacked: each conversation padded to a bucket
    length + 1 (`buckets`: by default at most four lengths fitted to the conversations'
    lengths, see `zoo.data.options.fit_buckets`). Training batches are
    reshuffled every epoch from `(seed, epoch)`.

    Args:
        examples: the encoded conversations (`encode_conversations`).
        pad_id: the id that fills the rows past their conversations.
        config: `batch_size`, `max_len`, `pack`, `buckets` and `seed` (the rest of a
            `ChatDataConfig` is not read here); None: `ChatDataConfig()`'s defaults.
        shuffle: reshuffle the batches every epoch (False: in order, for evaluation).
        drop_last: drop the last, smaller batch of an epoch (False keeps it, for evaluation).
        split: the data's name in messages.
    """
    config = config or ChatDataConfig()
    batch_size, max_len, seed = config.batch_size, config.max_len, config.seed
    if config.pack:
        arrays = pack_conversations(examples, max_len=max_len, pad_id=pad_id)
        rows = len(arrays["tokens"])
        if drop_last and rows < batch_size:
            raise DataError(
                f"the {split} conversations pack into {rows} rows of {max_len + 1} tokens, "
                f"fewer than batch_size={batch_size}; lower the batch size (--batch-size, "
                "batch_size) or max_len, or give "
                "more conversations"
            )
        capacity = capacity_for(largest_count(arrays["loss_mask"], arrays["segments"]), max_len)
        if capacity is not None and config.loss_positions:
            arrays[LOSS_POSITIONS] = loss_positions(
                arrays["loss_mask"], capacity, arrays["segments"]
            )
        return ArrayBatches(arrays, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
    if drop_last and len(examples) < batch_size:
        raise DataError(
            f"the {split} split has {len(examples)} conversations, fewer than "
            f"batch_size={batch_size}; lower the batch size (--batch-size, batch_size) or give "
            "more conversations"
        )
    needed = examples.tokens.lengths - 1  # a row holds one token more than the model reads
    needed = lengths_to_fit(
        needed, group_by_length=config.group_by_length, batch_size=batch_size, seed=seed
    )
    widths = [length + 1 for length in resolve_buckets(max_len, config.buckets, needed)]
    batches = batches_of(config.group_by_length)(
        {"tokens": examples.tokens, "loss_mask": examples.loss_mask},
        pad_ids={"tokens": pad_id, "loss_mask": 0},
        batch_size=batch_size,
        bucket_lengths=widths,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    return ListedPositions(batches, examples.most_trained) if config.loss_positions else batches
