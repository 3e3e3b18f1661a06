"""String in, string out: the decoding functions behind a model's tokenizer.

These are what `zoo generate`, `zoo translate` and `zoo classify` run on a saved model
(`zoo.serialize.load_with_tokenizer`) or a pretrained one (`zoo.from_pretrained(...,
return_tokenizer=True)`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh
from jaxtyping import PRNGKeyArray

from zoo.data.tokenizers.base import Tokenizer, warn_unknown
from zoo.data.tokenizers.pair import source_tokenizer, target_tokenizer
from zoo.decoding.classify import classify
from zoo.decoding.generate import generate
from zoo.decoding.placement import decoding_layout
from zoo.decoding.sampling import SamplingSettings, sampling_or_greedy
from zoo.decoding.translate import translate
from zoo.distributed.layout import Layout
from zoo.models import GPT, Classifier, Translator


def encode_texts(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    limit: int,
    *,
    truncate: bool = False,
    **special: bool,
) -> np.ndarray:
    """Right-padded `[len(texts), longest]` ids; longer than `limit` is an error or cut."""
    if not texts:
        raise ValueError("no texts given")
    blank = [index for index, text in enumerate(texts) if not text.strip()]
    if blank:
        raise ValueError(f"text {blank[0]} is empty; give some text (an empty string has no words)")
    rows = [tokenizer.encode(text, **special) for text in texts]
    if truncate:
        rows = [row[:limit] for row in rows]
    too_long = [i for i, row in enumerate(rows) if len(row) > limit]
    if too_long:
        raise ValueError(
            f"text {too_long[0]} has {len(rows[too_long[0]])} tokens; the model takes at most "
            f"{limit} here: shorten it"
        )
    if any(len(row) == 0 for row in rows):
        raise ValueError("an empty text has no tokens to start from")
    width = max(len(row) for row in rows)
    batch = np.full((len(rows), width), tokenizer.pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


def generate_texts(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    sampling: SamplingSettings | None = None,
    key: PRNGKeyArray | None = None,
    mesh: Mesh | str | Layout | None = None,
) -> list[str]:
    """Each prompt's continuation, decoded (the prompt itself not repeated).

    Args:
        model: a `zoo.GPT`.
        tokenizer: the model's tokenizer.
        prompts: the texts to continue.
        max_new_tokens: how many tokens to add to each prompt at most.
        sampling: how each token is chosen, as in `zoo.generate` (None is greedy).
        key: the random key of sampling, as in `zoo.generate`.
        mesh: where to decode, as in `zoo.generate`.
    """
    settings = sampling_or_greedy(sampling)
    layout = decoding_layout(mesh)
    limit = model.config.max_positions - max_new_tokens
    batch = encode_texts(tokenizer, prompts, limit)
    warn_unknown(tokenizer, prompts, "the prompts")
    lengths = np.array([len(tokenizer.encode(p)) for p in prompts], np.int32)
    tokens = generate(
        model, batch, max_new_tokens=max_new_tokens, sampling=settings, key=key,
        lengths=lengths, mesh=layout,
    )  # fmt: skip
    return [tokenizer.decode(np.asarray(row).tolist()) for row in tokens]


def translate_texts(
    model: Translator,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_len: int = 64,
    mesh: Mesh | str | Layout | None = None,
) -> list[str]:
    """Each source sentence translated and detokenized through the target tokenizer.

    Args:
        model: a `zoo.Translator`.
        tokenizer: the model's tokenizer (a pair of source and target tokenizers, or one).
        sources: the sentences to translate.
        beam_size: 1 for greedy decoding, more for beam search, as in `zoo.translate`.
        length_penalty: beam search's GNMT length penalty exponent.
        max_len: the longest translation in tokens (cut to the model's positions).
        mesh: where to decode, as in `zoo.translate`.
    """
    layout = decoding_layout(mesh)
    source = source_tokenizer(tokenizer)
    batch = encode_texts(source, sources, model.config.max_positions, add_eos=True)
    warn_unknown(source, sources, "the source texts")
    max_len = min(max_len, model.config.max_positions - 1)
    tokens = translate(
        model, batch, max_len=max_len, beam_size=beam_size, length_penalty=length_penalty,
        mesh=layout,
    )  # fmt: skip
    target = target_tokenizer(tokenizer)
    return [target.decode(np.asarray(row).tolist()) for row in tokens]


def classify_texts(
    model: Classifier,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    mesh: Mesh | str | Layout | None = None,
) -> np.ndarray:
    """Class probabilities `[len(texts), classes]`, encoded as in training (bos first).

    Texts longer than the model's `max_positions` are cut, as in training. `mesh` as in
    `zoo.classify`.
    """
    layout = decoding_layout(mesh)
    add_bos = tokenizer.bos_id is not None
    limit = model.config.max_positions
    batch = encode_texts(tokenizer, texts, limit, truncate=True, add_bos=add_bos)
    warn_unknown(tokenizer, texts, "the texts")
    return np.asarray(classify(model, batch, mesh=layout))
