"""The tokenizer a task uses: one given, or one built by kind from the train split's text.

A char or word vocabulary is learnt from the train split only (after any holdout), so held-out
text stays unseen. A stream is sampled: its first `tokenizer_sample` examples. For translation a
kind builds two tokenizers (a `PairTokenizer`: source from the source column, target from the
target column) unless `share_tokenizer`, which builds one from both; a tiktoken encoding is
always shared, having nothing to learn.
"""

from __future__ import annotations

from itertools import islice

import datasets

from zoo.data.checks import column_values, text_values
from zoo.data.options import DataConfig
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.build import build_tokenizer
from zoo.data.tokenizers.pair import PairTokenizer

DEFAULT_TOKENIZERS = {"classification": "word", "language_modeling": "char", "translation": "word"}


def texts_of(
    split: datasets.Dataset | datasets.IterableDataset, column: str, sample: int
) -> list[str]:
    """The strings of `column`: all of a `Dataset`, the first `sample` of a stream."""
    if isinstance(split, datasets.IterableDataset):
        values = [example[column] for example in islice(iter(split), sample)]
    else:
        values = column_values(split, column)
    return text_values(values, column)


def choose_tokenizer(
    tokenizer: Tokenizer | str | None,
    train: datasets.Dataset | datasets.IterableDataset,
    config: DataConfig,
) -> Tokenizer:
    """`tokenizer` itself, or one of that kind (None: the task's default) learnt from `train`."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    kind = DEFAULT_TOKENIZERS[config.task] if tokenizer is None else tokenizer
    options = config.tokenizer_options or {}
    if kind.startswith("tiktoken"):
        return build_tokenizer(kind, **options)
    sample = config.tokenizer_sample
    if config.task != "translation":
        return build_tokenizer(kind, texts_of(train, config.text_column, sample), **options)
    source_texts = texts_of(train, config.source_column, sample)
    target_texts = texts_of(train, config.target_column, sample)
    if config.share_tokenizer:
        return build_tokenizer(kind, source_texts + target_texts, **options)
    return PairTokenizer(
        build_tokenizer(kind, source_texts, **options),
        build_tokenizer(kind, target_texts, **options),
    )
