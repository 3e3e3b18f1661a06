"""Preference rows -> pairs of token ids -> batches for `zoo.tasks.Preference`.

    config = zoo.data.PreferenceDataConfig(max_len=512, batch_size=8)
    data = zoo.data.preference_data(zoo.data.load_spec("json:pairs/"), tokenizer=tokenizer,
                                    config=config)
    batch = data.train.batch(0)  # {"tokens", "loss_mask", "lengths"}: [batch, 2, ...]

Rows come in TRL's formats, told apart by the columns and the type of their values:

- standard: `prompt`, `chosen`, `rejected` are text; an answer ends with the eos token;
- conversational: they are lists of messages, rendered with the chat template (the prompt with
  the opening of the assistant's turn, as for generation);
- implicit prompt: no `prompt` column; the leading part `chosen` and `rejected` share (the
  shared messages, or the shared text) is the prompt.

As TRL does, the prompt and each `prompt + answer` are tokenized, and the answer is every token
after the part the two share. Truncation: `max_prompt_len` keeps the prompt's last tokens,
`max_completion_len` an answer's first ones, and `max_len` the first tokens of prompt + answer
(TRL's `keep_start`). A row gets an error naming it for a missing or empty answer, identical
answers, or a prompt that leaves no room for the answer within `max_len`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import numpy as np

from zoo.data.batches import ArrayBatches, BatchSource
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat, encode_prompt
from zoo.data.errors import DataError
from zoo.data.positions import LOSS_POSITIONS, capacity_for, largest_count, loss_positions
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.build import build_tokenizer

logger = logging.getLogger(__name__)
ANSWERS = ("chosen", "rejected")
# A conversational row's prompt or answer: its messages.
Turns: TypeAlias = list[Mapping[str, object]]
# A checked row (`row_parts`): prompt, chosen and rejected, three texts or three lists of turns.
Parts: TypeAlias = tuple[str, str, str] | tuple[Turns, Turns, Turns]
Side = TypeVar("Side", str, Turns)
# Preference rows: one split, or a `DatasetDict` (any mapping) of split names to splits.
Rows: TypeAlias = Iterable[Mapping[str, object]]


@dataclass(frozen=True, kw_only=True)
class PreferenceDataConfig:
    """How preference rows become batches (see the module doc)."""

    max_len: int | None = None  # most tokens of prompt + answer (None: no limit)
    max_prompt_len: int | None = None  # most prompt tokens, its last ones kept (None: all)
    max_completion_len: int | None = None  # most answer tokens, the first kept (None: all)
    batch_size: int = 8  # pairs per batch (the model reads twice as many rows)
    seed: int = 0  # shuffles the pairs and draws the held-out ones
    holdout: float = 0.1  # share of train pairs held out when there is no validation split
    train_split: str = "train"  # the split to train on
    validation_split: str | None = None  # the split to evaluate on (None: found or held out)
    loss_positions: bool = True  # list the answers' positions, where few (the head runs there)
    # train batches of batch_size pairs each (False: a partial last one too, as evaluation reads)
    drop_last: bool = True

    def __post_init__(self) -> None:
        for name in ("max_len", "max_prompt_len", "max_completion_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of tokens, got {value}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"holdout must be a fraction in (0, 1), got {self.holdout}")


@dataclass(frozen=True)
class PreferencePair:
    """One pair as the model reads it: the prompt's ids and each answer's."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


def preference_format(row: Mapping[str, object]) -> tuple[str, bool]:
    """`(kind, implicit)`: "standard" (text) or "conversational" (messages), and whether the
    prompt is implicit (no `prompt` column); ValueError when `chosen` / `rejected` are missing."""
    missing = [name for name in ANSWERS if name not in row]
    if missing:
        raise DataError(
            f"preference rows need 'chosen' and 'rejected' columns (and optionally 'prompt'); "
            f"missing {missing} among the columns {sorted(row)}"
        )
    kind = "conversational" if isinstance(row["chosen"], list | tuple) else "standard"
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
    """`(prompt, chosen, rejected)` of row `index`, checked (see the module doc)."""
    kind, implicit = preference_format(row)
    parts: Parts
    if kind == "conversational":
        parts = _sides(row, index, implicit, _turns)
    else:
        parts = _sides(row, index, implicit, _text)
    for name, value in zip(ANSWERS, parts[1:], strict=True):
        if not value or (isinstance(value, str) and not value.strip()):
            where = " after the prompt the answers share" if implicit else ""
            raise DataError(f"preference row {index}: the {name!r} answer is empty{where}")
    if parts[1] == parts[2]:
        raise DataError(
            f"preference row {index}: 'chosen' and 'rejected' are identical; a pair needs two "
            "different answers"
        )
    return parts


def _sides(
    row: Mapping[str, object],
    index: int,
    implicit: bool,
    read: Callable[[object, str, int], Side],
) -> tuple[Side, Side, Side]:
    """`(prompt, chosen, rejected)`, each column read (and checked) by `read`; an implicit
    prompt is the start the answers share (`split_prompt`)."""
    prompt = None if implicit else read(row["prompt"], "prompt", index)
    chosen, rejected = (read(row[name], name, index) for name in ANSWERS)
    if prompt is None:
        return split_prompt(chosen, rejected)
    return prompt, chosen, rejected


def _text(value: object, name: str, index: int) -> str:
    """A standard row's column: text."""
    if not isinstance(value, str):
        raise DataError(
            f"preference row {index}: {name!r} is {type(value).__name__}, expected text like "
            "the row's 'chosen'"
        )
    return value


def _turns(value: object, name: str, index: int) -> Turns:
    """A conversational row's column: a list of messages (mappings)."""
    if not isinstance(value, list | tuple):
        raise DataError(
            f"preference row {index}: {name!r} is {type(value).__name__}, expected a list of "
            "messages like the row's 'chosen'"
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


def _shared_length(left: Sequence[int], right: Sequence[int]) -> int:
    count = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        count += 1
    return count


def _ids(
    parts: Parts, tokenizer: Tokenizer, template: ChatTemplate | None
) -> tuple[list[int], list[int], list[int]]:
    match parts:
        case (list() as prompt, list() as chosen, list() as rejected):
            template = template or chat_template_for(tokenizer)
            prompt_ids = encode_prompt(prompt, tokenizer, template=template).tolist()
            whole = [
                encode_chat([*prompt, *answer], tokenizer, template=template).input_ids.tolist()
                for answer in (chosen, rejected)
            ]
        case (str() as prompt, str() as chosen, str() as rejected):
            bos = tokenizer.bos_id is not None
            prompt_ids = tokenizer.encode(prompt, add_bos=bos)
            eos = tokenizer.eos_id is not None
            whole = [tokenizer.encode(prompt + answer, add_bos=bos, add_eos=eos)
                     for answer in (chosen, rejected)]  # fmt: skip
        case _:
            raise TypeError("parts are three texts or three lists of messages (row_parts)")
    shared = min(_shared_length(prompt_ids, ids) for ids in whole)
    return prompt_ids[:shared], whole[0][shared:], whole[1][shared:]


def encode_pair(
    parts: Parts,
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    config: PreferenceDataConfig | None = None,
    index: int = 0,
) -> PreferencePair:
    """The ids of one checked row (`row_parts`), truncated as the module doc says."""
    config = config or PreferenceDataConfig()
    prompt, chosen, rejected = _ids(parts, tokenizer, template)
    if config.max_prompt_len is not None:
        prompt = prompt[-config.max_prompt_len :]
    if config.max_completion_len is not None:
        chosen, rejected = (
            chosen[: config.max_completion_len],
            rejected[: config.max_completion_len],
        )
    if config.max_len is not None:
        if len(prompt) >= config.max_len:
            raise DataError(
                f"preference row {index}: the prompt has {len(prompt)} tokens, which leaves no "
                f"room for the answer within max_len={config.max_len}; raise max_len (--max-len) "
                "or cut prompts with max_prompt_len (--max-prompt-len)"
            )
        room = config.max_len - len(prompt)
        chosen, rejected = chosen[:room], rejected[:room]
    for name, ids in (("chosen", chosen), ("rejected", rejected)):
        if not ids:
            raise DataError(f"preference row {index}: the {name!r} answer encodes to no tokens")
    if not prompt:
        raise DataError(
            f"preference row {index}: the prompt encodes to no tokens; the first answer token "
            "needs one before it (a tokenizer with bos_id, or a non-empty prompt)"
        )
    return PreferencePair(list(prompt), list(chosen), list(rejected))


def pair_arrays(
    pairs: Sequence[PreferencePair], pad_id: int, *, positions: bool = True
) -> dict[str, np.ndarray]:
    """`tokens`, `loss_mask` (`int32[pairs, 2, seq]`) and `lengths` (`int32[pairs, 2]`), padded
    on the right with `pad_id` to the longest row; with `positions`, also `loss_positions`
    (`int32[pairs, 2, capacity]`, `zoo.data.positions`) where the answers are short enough."""
    length = max(len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in pairs)
    tokens = np.full((len(pairs), 2, length), pad_id, np.int32)
    mask = np.zeros((len(pairs), 2, length), np.int32)
    lengths = np.zeros((len(pairs), 2), np.int32)
    for row, pair in enumerate(pairs):
        for side, answer in enumerate((pair.chosen, pair.rejected)):
            ids = pair.prompt + answer
            tokens[row, side, : len(ids)] = ids
            mask[row, side, len(pair.prompt) : len(ids)] = 1
            lengths[row, side] = len(ids)
    arrays = {"tokens": tokens, "loss_mask": mask, "lengths": lengths}
    rows = mask.reshape(-1, length)
    capacity = capacity_for(largest_count(rows), length - 1) if positions else None
    if capacity is not None:
        listed = loss_positions(rows, capacity)
        arrays[LOSS_POSITIONS] = listed.reshape(len(pairs), 2, capacity)
    return arrays


@dataclass(frozen=True)
class PreferenceData:
    """Train and validation batches of preference pairs, and how they were read."""

    train: BatchSource
    validation: BatchSource | None
    tokenizer: Tokenizer
    template: ChatTemplate | None  # None for standard (text) rows
    format: str  # "standard" or "conversational", "(implicit prompt)" added where so
    counts: dict[str, int]  # pairs per split


def encode_rows(
    rows: Sequence[Mapping[str, object]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    config: PreferenceDataConfig | None = None,
) -> list[PreferencePair]:
    """Every row checked and encoded (errors name the row's index)."""
    parts = [row_parts(row, index) for index, row in enumerate(rows)]
    if parts and isinstance(parts[0][1], list) and template is None:
        template = chat_template_for(tokenizer)
    return [encode_pair(part, tokenizer, template=template, config=config, index=index)
            for index, part in enumerate(parts)]  # fmt: skip


def _learnt_tokenizer(kind: str, rows: Sequence[Mapping[str, object]]) -> Tokenizer:
    """A char or word tokenizer learnt from the rows' text (a message as `role:\\ncontent`)."""
    if kind.startswith("tiktoken"):
        return build_tokenizer(kind)
    texts: list[str] = []
    for row in rows:
        for name in ("prompt", *ANSWERS):
            value = row.get(name)
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list | tuple):
                # a message that is no mapping is refused with its row (`row_parts`)
                texts.extend(
                    f"{m['role']}:\n{m['content']}" for m in value if isinstance(m, Mapping)
                )
    return build_tokenizer(kind, texts)


def preference_data(
    dataset: Mapping[str, Rows] | Rows,
    *,
    tokenizer: Tokenizer | str | None = None,
    config: PreferenceDataConfig | None = None,
) -> PreferenceData:
    """Train and validation batches of the preference rows in `dataset` (a `DatasetDict`, a
    mapping of split names to row lists, or one split). `tokenizer`: a `Tokenizer`, or a kind
    (char | word | tiktoken:NAME; default word) learnt from the train rows. Validation is the
    dataset's own split, else a seeded `holdout` share of the train pairs."""
    config = config or PreferenceDataConfig()
    train_rows, validation_rows, validation_name = _splits(dataset, config)
    if not train_rows:
        raise DataError(f"the {config.train_split!r} split has no preference rows")
    if isinstance(tokenizer, Tokenizer):
        chosen_tokenizer = tokenizer
    else:
        chosen_tokenizer = _learnt_tokenizer(tokenizer or "word", train_rows)
    kind, implicit = preference_format(train_rows[0])
    template = chat_template_for(chosen_tokenizer) if kind == "conversational" else None
    train = encode_rows(train_rows, chosen_tokenizer, template=template, config=config)
    if validation_rows is None:
        order = np.random.default_rng(config.seed).permutation(len(train))
        count = min(len(train) - 1, max(1, round(config.holdout * len(train))))
        held = set(order[:count].tolist())
        validation = [pair for i, pair in enumerate(train) if i in held]
        train = [pair for i, pair in enumerate(train) if i not in held]
    else:
        validation = encode_rows(validation_rows, chosen_tokenizer, template=template,
                                 config=config)  # fmt: skip
    pad = chosen_tokenizer.pad_id
    listed = config.loss_positions
    train_batches = ArrayBatches(pair_arrays(train, pad, positions=listed), config.batch_size,
                                 seed=config.seed, drop_last=config.drop_last)  # fmt: skip
    validation_batches = None
    if validation:
        validation_batches = ArrayBatches(pair_arrays(validation, pad, positions=listed),
                                          config.batch_size,
                                          shuffle=False, drop_last=False)  # fmt: skip
    counts = {config.train_split: len(train), validation_name: len(validation)}
    name = kind + (" (implicit prompt)" if implicit else "")
    logger.info("preference data (%s): %s", name, counts)
    return PreferenceData(train_batches, validation_batches, chosen_tokenizer, template, name,
                          counts)  # fmt: skip


def _splits(
    dataset: Mapping[str, Rows] | Rows, config: PreferenceDataConfig
) -> tuple[list[Mapping[str, object]], list[Mapping[str, object]] | None, str]:
    """(train rows, validation rows or None, the validation split's name)."""
    if not isinstance(dataset, Mapping):
        return list(dataset), None, f"{config.train_split} holdout"
    if config.train_split not in dataset:
        raise DataError(
            f"no {config.train_split!r} split in the dataset; its splits are {list(dataset)}"
        )
    train = list(dataset[config.train_split])
    names = (
        [config.validation_split]
        if config.validation_split
        else ["validation", "valid", "dev", "val", "test"]
    )
    for name in names:
        if name in dataset and name != config.train_split:
            return train, list(dataset[name]), name
    if config.validation_split:
        raise DataError(
            f"no {config.validation_split!r} split in the dataset; its splits are {list(dataset)}"
        )
    return train, None, f"{config.train_split} holdout"
