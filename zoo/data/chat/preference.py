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
after the part the two share. Special tokens follow TRL's trainer of the objective
(`special_tokens_for`): `DPOTrainer` (DPO, IPO, hinge, robust) puts bos first where the tokenizer
itself does (`Tokenizer.puts_bos_first`) and the chat template's own tokens only; the CPO and ORPO
trainers (SimPO, ORPO) put bos first and eos last on every row where the tokenizer declares them. Truncation: `max_prompt_len` keeps the prompt's last tokens,
`max_completion_len` an answer's first ones, and `max_len` the first tokens of prompt + answer
(TRL's `keep_start`). A row gets an error naming it for a missing or empty answer, identical
answers, or a prompt that leaves no room for the answer within `max_len`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from zoo.data.batches import ArrayBatches, BatchSource
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.preference_rows import (
    ANSWERS,
    MARGIN,
    Parts,
    Turns,
    check_answer,
    preference_format,
    row_margins,
    row_parts,
    split_prompt,
)
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_chat, encode_prompt
from zoo.data.errors import DataError
from zoo.data.positions import LOSS_POSITIONS, capacity_for, largest_count, loss_positions
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.build import build_tokenizer

logger = logging.getLogger(__name__)
# How rows get bos and eos (`PreferenceDataConfig.special_tokens`).
SPECIAL_TOKENS = ("tokenizer", "always")
# Objectives TRL trains with its CPO and ORPO trainers, which add bos and eos to every row.
ALWAYS_SPECIAL = ("simpo", "orpo")
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
    # bos/eos: "tokenizer" as the tokenizer and template write them (TRL's DPOTrainer), "always"
    # bos first and eos last on every row (TRL's CPO/ORPO); `special_tokens_for(objective)`
    special_tokens: str = "tokenizer"
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
        if self.special_tokens not in SPECIAL_TOKENS:
            raise ValueError(
                f"special_tokens must be one of {SPECIAL_TOKENS}, got {self.special_tokens!r}"
            )


@dataclass(frozen=True)
class PreferencePair:
    """One pair as the model reads it: the prompt's ids and each answer's."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    margin: float | None = None  # the row's `margin` column: how much better chosen is (reward)


def special_tokens_for(objective: str) -> str:
    """`PreferenceDataConfig.special_tokens` as TRL's trainer of `objective` adds them: "always"
    for SimPO and ORPO (`CPOTrainer`, `ORPOTrainer`), else "tokenizer" (`DPOTrainer`)."""
    return "always" if objective in ALWAYS_SPECIAL else "tokenizer"


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
            bos = tokenizer.bos_id is not None and tokenizer.puts_bos_first
            prompt_ids = tokenizer.encode(prompt, add_bos=bos)
            eos = tokenizer.eos_id is not None
            whole = [tokenizer.encode(prompt + answer, add_bos=bos, add_eos=eos)
                     for answer in (chosen, rejected)]  # fmt: skip
        case _:
            raise TypeError("parts are three texts or three lists of messages (row_parts)")
    shared = min(_shared_length(prompt_ids, ids) for ids in whole)
    return prompt_ids[:shared], whole[0][shared:], whole[1][shared:]


def _with_bos_and_eos(
    prompt: list[int], chosen: list[int], rejected: list[int], tokenizer: Tokenizer
) -> tuple[list[int], list[int], list[int]]:
    """bos before the prompt and eos after each answer where not there yet (TRL's CPO/ORPO
    `add_bos_token_if_needed`, `add_eos_token_if_needed`)."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    if bos is not None and prompt[:1] != [bos]:
        prompt = [bos, *prompt]
    if eos is not None:
        chosen, rejected = (
            [*ids] if ids[-1:] == [eos] else [*ids, eos] for ids in (chosen, rejected)
        )
    return prompt, chosen, rejected


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
    try:
        prompt, chosen, rejected = _ids(parts, tokenizer, template)
        if config.special_tokens == "always":
            prompt, chosen, rejected = _with_bos_and_eos(prompt, chosen, rejected, tokenizer)
    except ValueError as error:  # the template refuses the conversation (tools it would drop)
        raise DataError(f"preference row {index}: {error}") from error
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
            "needs one before it (a non-empty prompt, or a tokenizer that puts bos first)"
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
    if all(pair.margin is not None for pair in pairs):
        arrays[MARGIN] = np.array([pair.margin for pair in pairs], np.float32)
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
    margins = row_margins(rows)
    return [dataclasses.replace(encode_pair(part, tokenizer, template=template, config=config,
                                            index=index), margin=margin)
            for index, (part, margin) in enumerate(zip(parts, margins, strict=True))]  # fmt: skip


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


__all__ = [
    "ANSWERS",
    "Parts",
    "PreferenceData",
    "PreferenceDataConfig",
    "PreferencePair",
    "Turns",
    "check_answer",
    "encode_pair",
    "encode_rows",
    "pair_arrays",
    "preference_data",
    "preference_format",
    "row_parts",
    "special_tokens_for",
    "split_prompt",
]
