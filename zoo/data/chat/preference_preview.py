"""See preference pairs as the model is trained on them (`zoo train --objective dpo --show-data N`).

    from zoo.data.chat.preference_preview import preview_preference_data
    print(preview_preference_data(load_spec("json:pairs/"), tokenizer="char", count=2).text)

Each shown pair is its prompt as the model reads it (rendered with the chat template for rows
of messages), then the chosen and the rejected answer, each as it follows the prompt: the
tokens the loss scores (every answer token, after any cut) are wrapped in `[[` and `]]` (green
on a terminal, `color=True`), as `zoo.data.chat.preview` marks a conversation's. Control
characters of the data are shown escaped. Below come the pairs per split and the lengths of
prompt + answer in tokens, as trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zoo.data.batches import ArrayBatches, BatchSource
from zoo.data.chat.preference import (
    PreferenceDataConfig,
    PreferencePair,
    Rows,
    encode_rows,
    preference_data,
)
from zoo.data.chat.preview import CLOSE, GREEN, OPEN, RESET, marked, spans
from zoo.data.tokenizers.base import Tokenizer
from zoo.text import printable


@dataclass(frozen=True)
class PreferencePreview:
    """What `preview_preference_data` found; `text` is the report it prints."""

    text: str  # the shown pairs, the legend and the statistics
    counts: dict[str, int]  # pairs per split (a held-out validation named as such)
    percentiles: dict[str, int]  # p50, p90, p99, max: tokens of prompt + answer, train pairs


def preview_preference_data(
    dataset: Mapping[str, Rows] | Rows,
    *,
    tokenizer: Tokenizer | str | None = None,
    config: PreferenceDataConfig | None = None,
    count: int = 3,
    color: bool = False,
) -> PreferencePreview:
    """The first `count` pairs of the train split of `dataset` as trained, and the statistics.

    `dataset`, `tokenizer` and `config` are those of `zoo.data.preference_data`, which reads
    them (every row checked, the tokenizer learnt where it is a kind); `color` marks the scored
    tokens with ANSI green instead of `[[ ]]`.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    config = config or PreferenceDataConfig()
    # the pairs are shown, not batched: a batch size larger than the data is no matter here
    data = preference_data(dataset, tokenizer=tokenizer,
                           config=dataclasses.replace(config, batch_size=1))  # fmt: skip
    split = dataset[config.train_split] if isinstance(dataset, Mapping) else dataset
    first = [row for _, row in zip(range(count), split, strict=False)]
    pairs = encode_rows(first, data.tokenizer, template=data.template, config=config)
    lines = [render_pair(index, pair, data.tokenizer, color=color)
             for index, pair in enumerate(pairs)]  # fmt: skip
    legend = (f"{GREEN}green{RESET}" if color else f"{OPEN}marked{CLOSE}") + " text is scored"
    origin = "no template (text rows)" if data.template is None else data.template.origin
    lines.append(f"--- legend: {legend} (each answer's tokens after the prompt); "
                 f"{data.format} format, {printable(origin)} ---")  # fmt: skip
    counts = ", ".join(f"{name}: {number}" for name, number in data.counts.items())
    lines.append(f"pairs: {counts}")
    percentiles = _percentiles(data.train)
    if percentiles:
        shown = ", ".join(f"{name} {value}" for name, value in percentiles.items())
        lines.append(f"lengths in tokens (prompt + answer, as trained): {shown}")
    return PreferencePreview("\n".join(lines), dict(data.counts), percentiles)


def render_pair(index: int, pair: PreferencePair, tokenizer: Tokenizer, *, color: bool) -> str:
    """Pair `index`: its prompt, then each answer with its scored tokens marked."""
    prompt = printable(tokenizer.decode(pair.prompt, skip_special=False))
    blocks = [f"--- pair {index}: prompt ---\n{prompt}"]
    for name, answer in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        # decoded after the prompt, as the model reads it: a token may join onto the prompt's
        pieces = spans(pair.prompt + answer, [0] * len(pair.prompt) + [1] * len(answer), tokenizer)
        scored = pieces[1:] if pieces and not pieces[0][1] else pieces
        blocks.append(f"--- pair {index}: {name} ---\n{marked(scored, color=color)}")
    return "\n".join(blocks)


def _percentiles(train: BatchSource) -> dict[str, int]:
    """p50, p90, p99 and max of prompt + answer in tokens over the train pairs (none when the
    batches do not hold their arrays)."""
    if not isinstance(train, ArrayBatches) or "lengths" not in train.arrays:
        return {}
    lengths = np.asarray(train.arrays["lengths"]).reshape(-1)
    if not len(lengths):
        return {}
    found = {f"p{q}": round(float(np.percentile(lengths, q))) for q in (50, 90, 99)}
    found["max"] = int(lengths.max())
    return found


__all__ = ["PreferencePreview", "preview_preference_data", "render_pair"]
