"""`chat_data`: a dataset of conversations -> train and validation batches for instruction tuning.

    import zoo.data
    config = zoo.data.ChatDataConfig(max_len=256, batch_size=16)
    data = zoo.data.chat_data(zoo.data.load_spec("json:chats/"), tokenizer=tokenizer,
                              config=config)
    batch = data.train.batch(0)  # {"tokens", "loss_mask", "segments"}: zoo.tasks.LanguageModeling

Rows are chat messages, Alpaca instruction records or prompt/completion pairs
(`zoo.data.chat.conversations`); the format is detected from the columns of the train split
unless `format` names it. Every option is a field of `ChatDataConfig` (`zoo.data.chat.options`).
Validation is the dataset's own split (validation / valid / dev / val, or `validation_split`),
else a seeded `holdout` fraction of the train conversations. A char or word vocabulary is learnt
from the train conversations (their role names and contents). Everything else (template, loss
mask, packing) is `zoo.data.chat.batches`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import datasets
import numpy as np

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

from zoo.data.batches import BatchSource
from zoo.data.chat.batches import ChatExamples, chat_batches, encode_conversations
from zoo.data.chat.conversations import (
    EXPECTED,
    FORMATS,
    Conversation,
    conversation_messages,
    detect_format,
)
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.markers import check_markers
from zoo.data.chat.options import CHAT_FORMATS, ChatDataConfig, resolve_train_on
from zoo.data.chat.template import ChatTemplate
from zoo.data.checks import check_not_empty, column_names
from zoo.data.errors import DataError
from zoo.data.options import DataConfig
from zoo.data.splits import AnyData, AnySplit, pick_splits
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.build import build_tokenizer

DEFAULT_CHAT_TOKENIZER = "word"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatData:
    """What instruction tuning needs. Unpacks as `train, validation, tokenizer = data`."""

    train: BatchSource
    validation: BatchSource
    tokenizer: Tokenizer
    template: ChatTemplate  # renders every conversation (and, later, the chat prompts)
    format: str  # messages | instruction | prompt_completion
    # split name -> {"conversations", "tokens", "trained_tokens"}
    counts: dict[str, dict[str, int]]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.train, self.validation, self.tokenizer))


def chat_format_of(
    split: AnySplit, format: str | None = None, *, messages_column: str | None = None
) -> str:
    """The conversation format of `split`: `format` checked, else detected from its columns
    (`messages_column`: the column of messages, which must be there)."""
    if format not in (None, "auto") and format not in FORMATS:
        raise ValueError(f"unknown chat format {format!r}; choose one of {CHAT_FORMATS}")
    columns = column_names(split)
    if messages_column is not None and messages_column not in columns:
        raise DataError(
            f"no column {messages_column!r} (the messages column asked for) in the data; its "
            f"columns are {columns}"
        )
    if format not in (None, "auto"):
        return format
    found = detect_format(columns, messages_column=messages_column)
    if found is None:
        raise DataError(
            f"the columns {columns} fit no conversation format: expected "
            f"{'; or '.join(EXPECTED.values())}"
        )
    return found


def split_conversations(
    split: AnySplit,
    *,
    format: str | None = None,
    require_assistant: bool = True,
    config: ChatDataConfig | None = None,
) -> list[Conversation]:
    """Every row of `split` as normalised messages (`zoo.data.chat.conversations`); `config`
    gives the `roles` and the `messages_column`."""
    if isinstance(split, datasets.IterableDataset):
        raise DataError(
            "chat data is read into memory (conversations are packed across the whole split); "
            "load it without streaming"
        )
    config = config or ChatDataConfig()
    column = config.messages_column
    chosen = chat_format_of(split, format, messages_column=column)
    detected = format in (None, "auto")
    return [
        conversation_messages(
            row,
            format=chosen,
            index=index,
            require_assistant=require_assistant,
            roles=config.roles,
            messages_column=column,
            detected=detected,
        )
        for index, row in enumerate(split)
    ]


def chat_data(
    dataset: AnyData,
    *,
    tokenizer: Tokenizer | str | None = None,
    config: ChatDataConfig | None = None,
) -> ChatData:
    """Train and validation batches of the conversations in `dataset` (see the module doc).

    `tokenizer` is a `Tokenizer` (a pretrained model's, whose chat template it carries), or a
    kind (char | word | tiktoken:NAME; default word) learnt from the train conversations.
    `config` holds every other option (`ChatDataConfig`): its `template` (a `ChatTemplate` or
    Jinja text) overrides the tokenizer's own template, and a tokenizer without one gets zoo's
    default (logged); `train_on` says which tokens the loss counts (`ChatDataConfig`: the
    replies, the completion, the last reply, or all); `pack` packs conversations into rows of
    `max_len + 1` tokens (`zoo.data.chat.batches`).
    """
    config = config or ChatDataConfig()
    splits = DataConfig(task="language_modeling", train_split=config.train_split,
                        validation_split=config.validation_split)  # fmt: skip
    train, validation, validation_name = pick_splits(dataset, splits)
    train_split = config.train_split
    if not isinstance(train, datasets.IterableDataset):
        check_not_empty(train, train_split)
    chosen_format = chat_format_of(train, config.format, messages_column=config.messages_column)
    detected = chosen_format if config.format != "auto" else None
    train_rows = split_conversations(train, format=detected, config=config)
    train_on = resolve_train_on(config.train_on, chosen_format)
    if validation is None:
        train_rows, validation_rows = _hold_out(train_rows, config.holdout, config.seed,
                                                train_split)  # fmt: skip
    else:
        if not isinstance(validation, datasets.IterableDataset):
            check_not_empty(validation, validation_name)
        validation_rows = split_conversations(validation, format=chosen_format, config=config)
    chosen = _tokenizer(tokenizer, train_rows, config.tokenizer_options)
    template = _template(chosen, config.template)
    # the tokenizer's own template spells its markers as its vocabulary does
    own = isinstance(tokenizer, Tokenizer) and config.template is None
    first = train_rows[0]
    sample = template.render(first, tools=getattr(first, "tools", None))
    check_markers(template, chosen, own=own, rendered=sample)
    encoded = {}
    for name, rows in ((train_split, train_rows), (validation_name, validation_rows)):
        encoded[name] = encode_conversations(
            rows, chosen, template=template, train_on=train_on, max_len=config.max_len,
            truncate=config.truncate, split=name,
        )  # fmt: skip
    train_source = chat_batches(encoded[train_split], pad_id=chosen.pad_id, config=config,
                                split=train_split)  # fmt: skip
    validation_source = chat_batches(encoded[validation_name], pad_id=chosen.pad_id,
                                     config=config, shuffle=False, drop_last=False,
                                     split=validation_name)  # fmt: skip
    counts = {name: _counts(examples) for name, examples in encoded.items()}
    logger.info("chat data (%s format, train on %s tokens): %s", chosen_format, train_on,
                counts)  # fmt: skip
    return ChatData(train_source, validation_source, chosen, template, chosen_format, counts)


@dataclass(frozen=True)
class ChatEvaluation:
    """The batches `zoo eval` scores, one conversation per row in the split's order."""

    batches: BatchSource
    name: str  # the split, or "validation (held out of train)"
    conversations: int
    tokens: int  # every token of the conversations
    trained_tokens: int  # the tokens the loss counts (`train_on`)
    unknown_token_rate: float | None  # the share of `unk_id` among `tokens`


def chat_evaluation(
    dataset: AnyData,
    tokenizer: Tokenizer,
    *,
    split: str = "validation",
    config: ChatDataConfig | None = None,
) -> ChatEvaluation:
    """The conversations of `split`, encoded with the model's `tokenizer` and chat template as
    `chat_data` encodes them for training, one conversation per row (`config.pack` is not
    read). Without a `validation` split, `split="validation"` reads the conversations
    `chat_data` held out of `config.train_split` (the same `seed` and `holdout` give the same
    ones)."""
    config = config or ChatDataConfig()
    splits = dataset if isinstance(dataset, Mapping) else {split: dataset}
    if split in splits:
        rows, name = split_conversations(splits[split], format=config.format, config=config), split
    elif split == "validation" and config.train_split in splits:
        train_rows = split_conversations(splits[config.train_split], format=config.format,
                                         config=config)  # fmt: skip
        rows, name = (
            _hold_out(train_rows, config.holdout, config.seed, config.train_split)[1],
            "validation (held out of train)",
        )
    else:
        raise DataError(f"no {split!r} split of conversations; the splits are {sorted(splits)}")
    if not rows:
        raise DataError(f"the {name!r} split has no conversations to evaluate")
    chosen_format = chat_format_of(splits.get(split, splits.get(config.train_split)),
                                   config.format, messages_column=config.messages_column)  # fmt: skip
    examples = encode_conversations(
        rows, tokenizer, template=_template(tokenizer, config.template),
        train_on=resolve_train_on(config.train_on, chosen_format), max_len=config.max_len,
        truncate=config.truncate, split=name,
    )  # fmt: skip
    batches = chat_batches(examples, pad_id=tokenizer.pad_id, config=replace(config, pack=False),
                           shuffle=False, drop_last=False, split=name)  # fmt: skip
    counts = _counts(examples)
    unk = tokenizer.unk_id
    rate = None
    if unk is not None and counts["tokens"]:
        rate = round(float((np.asarray(examples.tokens.flat) == unk).mean()), 4)
    return ChatEvaluation(batches, name, counts["conversations"], counts["tokens"],
                          counts["trained_tokens"], rate)  # fmt: skip


def is_chat_data(dataset: AnyData, *, train_split: str = "train") -> bool:
    """Whether the train split's columns fit a conversation format (rows of chat messages,
    instruction records or prompt/completion pairs)."""
    split = dataset if not isinstance(dataset, Mapping) else dataset.get(train_split)
    return split is not None and detect_format(column_names(split)) is not None


def _hold_out(
    rows: list[Conversation], fraction: float, seed: int, split: str
) -> tuple[list[Conversation], list[Conversation]]:
    """A seeded random `fraction` of the conversations for validation, the rest to train."""
    if len(rows) < 2:
        raise DataError(
            f"the {split!r} split has {len(rows)} conversation: too few to hold out a "
            "validation part; add conversations or give a validation split"
        )
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(rows))
    count = min(len(rows) - 1, max(1, round(fraction * len(rows))))
    held = set(order[:count].tolist())
    logger.info("no validation split: held out %d of %d conversations (seed %d)", count,
                len(rows), seed)  # fmt: skip
    kept = [row for index, row in enumerate(rows) if index not in held]
    return kept, [rows[index] for index in sorted(held)]


def _tokenizer(
    tokenizer: Tokenizer | str | None,
    rows: list[Conversation],
    options: Mapping[str, Any] | None,
) -> Tokenizer:
    """`tokenizer` itself, or one of that kind learnt from the conversations' text."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    kind = tokenizer or DEFAULT_CHAT_TOKENIZER
    if kind.startswith("tiktoken"):
        return build_tokenizer(kind, **dict(options or {}))
    # A role is written as its name on a line of its own by zoo's default template.
    texts = [f"{m['role']}:\n{m['content']}" for messages in rows for m in messages]
    return build_tokenizer(kind, texts, **dict(options or {}))


def _template(tokenizer: Tokenizer, template: ChatTemplate | str | None) -> ChatTemplate:
    """`template` itself, Jinja text made a template with `tokenizer`'s special tokens, or (None)
    the tokenizer's own template, else zoo's default."""
    if isinstance(template, ChatTemplate):
        return template
    return chat_template_for(tokenizer, template=template)


def _counts(examples: ChatExamples) -> dict[str, int]:
    return {
        "conversations": len(examples),
        "tokens": examples.total_tokens,
        "trained_tokens": examples.trained_tokens,
    }
