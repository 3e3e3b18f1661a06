"""Text columns -> token ids with `Dataset.map(batched=True)`, truncated to what the model takes.

`Encoder` is a plain picklable object, so `datasets` fingerprints it and caches the tokenized
split next to the dataset's Arrow files: a second run with the same data and tokenizer reads the
cache instead of tokenizing again. The same encoder tokenizes streams (`IterableDataset.map`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import datasets
import numpy as np

from zoo.data.checks import DataError, text_values
from zoo.data.ragged import Ragged
from zoo.data.tokenizers.base import Tokenizer

logger = logging.getLogger(__name__)
TRUNCATED = "truncated"


@dataclass(frozen=True)
class Field:
    """How one text column becomes one token sequence."""

    column: str  # the text column read
    name: str  # the batch key written (tokens, src, tgt)
    tokenizer: Tokenizer
    add_bos: bool = False
    add_eos: bool = False
    max_tokens: int | None = None  # None: keep every token (packing cuts blocks later)


class Encoder:
    """`Dataset.map` function: a batch of examples -> token-id lists and a truncated flag."""

    def __init__(self, fields: tuple[Field, ...], passthrough: tuple[tuple[str, str], ...] = ()):
        self.fields = fields
        self.passthrough = passthrough  # (column, name) pairs copied as they are (labels)

    def __call__(self, batch: Mapping[str, Collection[object]]) -> dict[str, Sequence[object]]:
        rows = len(batch[self.fields[0].column])
        truncated = [False] * rows
        out: dict[str, Sequence[object]] = {}
        for field in self.fields:
            texts = text_values(batch[field.column], field.column)
            encoded = field.tokenizer.encode_many(
                texts, add_bos=field.add_bos, add_eos=field.add_eos
            )
            limit = field.max_tokens
            rows_out = []
            for row, ids in enumerate(encoded):
                if limit is not None and len(ids) > limit:
                    truncated[row] = True
                    # keep the eos as the last token when there is one
                    ids = [*ids[: limit - 1], ids[-1]] if field.add_eos else ids[:limit]
                rows_out.append(np.asarray(ids, dtype=np.int32))  # Arrow takes arrays fast
            out[field.name] = rows_out
        out[TRUNCATED] = truncated
        for column, name in self.passthrough:
            out[name] = list(batch[column])
        return out


def encode_split(
    split: datasets.Dataset,
    fields: tuple[Field, ...],
    *,
    split_name: str,
    truncate_long: bool,
    num_proc: int | None = None,
) -> dict[str, Ragged]:
    """Token ids of every field of `split`, one `Ragged` per field name."""
    encoded = split.map(
        Encoder(fields),
        batched=True,
        remove_columns=split.column_names,
        num_proc=num_proc,
        desc=f"tokenizing {split_name}",
    )
    table = encoded.with_format("arrow")[:]
    cut = int(np.count_nonzero(table.column(TRUNCATED).to_numpy(zero_copy_only=False)))
    report_truncation(cut, len(split), fields, split_name, truncate_long)
    return {field.name: Ragged.from_arrow(table.column(field.name)) for field in fields}


def report_truncation(
    cut: int, total: int, fields: tuple[Field, ...], split_name: str, truncate_long: bool
) -> None:
    """Log how many examples were cut, or refuse them when truncation is off."""
    if cut == 0:
        return
    limits = ", ".join(f"{f.column}: {f.max_tokens} tokens" for f in fields)
    if not truncate_long:
        raise DataError(
            f"{cut} of {total} examples in the {split_name!r} split are longer than the model "
            f"takes ({limits}); raise max_len (up to the model's max_positions) or pass "
            "truncate=True to cut them"
        )
    logger.warning(
        "truncated %d of %d examples in the %r split to fit (%s)", cut, total, split_name, limits
    )
