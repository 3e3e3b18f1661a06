"""Batch translation with a Translator: encode once, then decode greedily or with beam search.

The encoder runs once per source and every decoder layer's cross-attention keys/values are
computed once (`Translator.start_decoding`). With beams, only the self-attention cache is copied
per beam and reordered; the cross-attention keys/values stay one copy per source.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from zoo.decoding.batching import TokenBatch, pad_batch, sequence_lengths
from zoo.decoding.beam import beam_search, repeat_beams
from zoo.decoding.loop import fill_token, sample_loop
from zoo.models.common import DecodeCache
from zoo.models.translator import Translator, TranslatorState


def start_translation(
    model: Translator, src: Int[Array, "batch src"], max_len: int
) -> TranslatorState:
    """Encode every source and allocate a `max_len`-position decoder cache per source."""
    return jax.vmap(lambda source: model.start_decoding(source, max_len))(src)


def translator_step(
    model: Translator, tokens: Int[Array, " batch"], states: TranslatorState
) -> tuple[Float[Array, "batch vocab"], TranslatorState]:
    """Feed one target token per source; returns next-token logits and the new states."""

    def one(token, state):
        logits, state = model.decode_step(token[None], state)
        return logits[0], state

    return jax.vmap(one)(tokens, states)


def _beam_step(model: Translator, sources: TranslatorState):
    """A step over `[batch, beams]` that shares each source's cross keys/values across beams."""

    def per_source(source, tokens, caches):
        def per_beam(token, cache):
            state = eqx.tree_at(lambda s: s.cache, source, cache)
            logits, state = model.decode_step(token[None], state)
            return logits[0], state.cache

        return jax.vmap(per_beam)(tokens, caches)

    return lambda tokens, caches: jax.vmap(per_source)(sources, tokens, caches)


@eqx.filter_jit
def _greedy(model, src, max_len):
    c = model.config
    states = start_translation(model, src, max_len)
    tokens, _ = sample_loop(
        lambda tokens, states: translator_step(model, tokens, states),
        states,
        jnp.full((src.shape[0],), c.bos_id, jnp.int32),
        max_new_tokens=max_len,
        values=None,
        key=None,
        eos_id=c.eos_id,
        fill_id=fill_token(c.pad_id, c.eos_id),
    )
    return tokens


@eqx.filter_jit
def _beam(model, src, max_len, beam_size, alpha):
    c = model.config
    states = start_translation(model, src, max_len)
    caches: DecodeCache = repeat_beams(states.cache, beam_size)
    tokens, scores, _ = beam_search(
        _beam_step(model, states),
        caches,
        jnp.full((src.shape[0],), c.bos_id, jnp.int32),
        beam_size=beam_size,
        max_len=max_len,
        eos_id=c.eos_id,
        fill_id=fill_token(c.pad_id, c.eos_id),
        alpha=alpha,
    )
    return tokens, scores


def _prepare(model, src, max_len, beam_size):
    if not isinstance(model, Translator):
        raise TypeError(
            f"translate needs a zoo.Translator, got {type(model).__name__}; "
            "use zoo.generate for a GPT"
        )
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    limit = model.config.max_positions
    if not isinstance(max_len, int) or not 1 <= max_len <= limit:
        raise ValueError(
            f"max_len must be an integer in [1, max_positions={limit}], got {max_len!r}"
        )
    batch = pad_batch(src, model.config.pad_id, what="sources")
    sequence_lengths(batch, model.config.pad_id, what="sources")  # rejects empty sources
    if batch.shape[1] > limit:
        raise ValueError(
            f"sources have {batch.shape[1]} tokens but the model takes at most "
            f"max_positions={limit}; truncate them"
        )
    return jnp.asarray(batch)


def beam_translate(
    model: Translator,
    src: TokenBatch,
    *,
    max_len: int,
    beam_size: int,
    length_penalty: float = 0.6,
) -> tuple[Int[Array, "batch max_len"], Float[Array, " batch"]]:
    """Beam search translations and their scores (log-probability / GNMT length penalty)."""
    batch = _prepare(model, src, max_len, beam_size)
    return _beam(model, batch, max_len, beam_size, float(length_penalty))


def translate(
    model: Translator,
    src: TokenBatch,
    *,
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 0.6,
) -> Int[Array, "batch max_len"]:
    """Translate a batch of sources; returns the target tokens after `bos_id`.

    `src` is `[batch, src]` right-padded with `pad_id` (or a list of token lists). Decoding
    starts from `bos_id`; `beam_size=1` is greedy, larger sizes run beam search with the GNMT
    length penalty `((5 + length) / 6) ** length_penalty`. After `eos_id` the output holds
    `pad_id` (or `eos_id` when the model has no pad token). Compiles once per (batch, source
    width, max_len, beam_size).
    """
    batch = _prepare(model, src, max_len, beam_size)
    if beam_size == 1:
        return _greedy(model, batch, max_len)
    tokens, _ = _beam(model, batch, max_len, beam_size, float(length_penalty))
    return tokens
