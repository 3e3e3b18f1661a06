"""Batch translation with a Translator: encode once, then decode greedily or with beam search.

The encoder runs once per source and every decoder layer's cross-attention keys/values are
computed once (`Translator.start_decoding`). With beams, every beam row gets its own copy of its
source's cross keys/values, made once before decoding (a fused attention kernel such as
cuDNN's reads keys per row); only the self-attention caches are reordered between beams.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int

from zoo.decoding.batching import TokenBatch, pad_batch, sequence_lengths
from zoo.decoding.beam import repeat_rows
from zoo.decoding.loop import Stopping, fill_token
from zoo.decoding.placement import decoding_layout
from zoo.decoding.search import Beam, decode, placed, positive
from zoo.distributed.layout import Layout
from zoo.models.translator import Translator, TranslatorState
from zoo.nn.cache import KVCache


class SourceMemory(NamedTuple):
    """What decoding needs from each encoded source (stacked on a leading `batch` axis)."""

    cross_keys: Float[Array, "batch layers src kv_heads head_dim"]
    cross_values: Float[Array, "batch layers src kv_heads head_dim"]
    source_length: Int[Array, " batch"]


def start_translation(
    model: Translator, src: Int[Array, "batch src"], max_len: int
) -> tuple[SourceMemory, KVCache]:
    """Encode every source once; allocate a `max_len`-position decoder cache per source."""

    def start(source):
        state = model.start_decoding(source, max_len)
        return SourceMemory(state.cross_keys, state.cross_values, state.source_length), state.cache

    return jax.vmap(start)(src)


def translator_step(
    model: Translator,
    memory: SourceMemory,
    tokens: Int[Array, " rows"],
    caches: KVCache,
) -> tuple[Float[Array, "rows vocab"], KVCache]:
    """Feed one target token per row; returns next-token logits and the grown caches.

    `memory` has one entry per row (`repeat_rows` repeats each source's for its beams).
    """

    def one(source, token, cache):
        state = TranslatorState(*source, cache)
        logits, state = model.decode_step(token[None], state)
        return logits[0], state.cache

    return jax.vmap(one)(memory, tokens, caches)


@eqx.filter_jit
def _translate(model, src, max_len, beam):
    c = model.config
    memory, caches = start_translation(model, src, max_len)
    rows = memory if beam is None else repeat_rows(memory, beam.size)  # each beam's own copy
    stopping = Stopping(max_len, c.eos_id, fill_token(c.pad_id, c.eos_id))
    step = lambda tokens, caches: translator_step(model, rows, tokens, caches)  # noqa: E731
    bos = jnp.full((src.shape[0],), c.bos_id, jnp.int32)
    return decode(step, caches, bos, stopping, beam=beam)


def _prepare(model, src, max_len, beam_size, layout):
    """Check the request; return the model and the padded sources placed for decoding."""
    if not isinstance(model, Translator):
        raise TypeError(
            f"translate needs a zoo.Translator, got {type(model).__name__}; "
            "use zoo.generate for a GPT"
        )
    positive("beam_size", beam_size)
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
    model, (batch,) = placed(layout, model, batch)
    return model, batch


def beam_translate(
    model: Translator,
    src: TokenBatch,
    *,
    max_len: int,
    beam_size: int,
    length_penalty: float = 0.6,
    mesh: Mesh | str | Layout | None = None,
) -> tuple[Int[Array, "batch max_len"], Float[Array, " batch"]]:
    """Beam search translations and their scores (log-probability / GNMT length penalty).

    Args:
        model: a `zoo.Translator`.
        src: the sources, as in `translate`.
        max_len: the longest translation in tokens.
        beam_size: how many hypotheses stay alive per source.
        length_penalty: the exponent of the GNMT length penalty (0 ranks by log-probability).
        mesh: where to decode, as in `translate`.
    """
    layout = decoding_layout(mesh)
    model, batch = _prepare(model, src, max_len, beam_size, layout)
    return _translate(model, batch, max_len, Beam(beam_size, float(length_penalty)))


def translate(
    model: Translator,
    src: TokenBatch,
    *,
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    mesh: Mesh | str | Layout | None = None,
) -> Int[Array, "batch max_len"]:
    """Translate a batch of sources; returns the target tokens after `bos_id`.

    Decoding starts from `bos_id`; `beam_size=1` is greedy, larger sizes run beam search with
    the GNMT length penalty `((5 + length) / 6) ** length_penalty`. After `eos_id` the output
    holds `pad_id` (or `eos_id` when the model has no pad token). Compiles once per (batch,
    source width, max_len, beam_size).

    On many devices the model goes onto the rules' shardings (used as it is when already
    there), the sources are split by rows over `data x fsdp` when their number is a multiple
    of it and copied whole to every device otherwise, and the encoder memory and KV cache keep
    the sources' rows and their key/value heads split over `tensor`. The tokens are those of
    one device.

    Args:
        model: a `zoo.Translator`.
        src: `[batch, src]` token ids right-padded with `pad_id`, or a list of token lists.
        max_len: the longest translation in tokens (at most `max_positions`).
        beam_size: 1 for greedy decoding, more for beam search.
        length_penalty: beam search's GNMT length penalty exponent.
        mesh: where to decode on many devices: a `jax.sharding.Mesh`, a string like
            `"data=2,fsdp=2,tensor=2"` (as for `zoo.Trainer`), or a `zoo.distributed.Layout`
            for partition rules other than `zoo.distributed.RULES`; None is one device.
    """
    layout = decoding_layout(mesh)
    model, batch = _prepare(model, src, max_len, beam_size, layout)
    beam = None if beam_size == 1 else Beam(beam_size, float(length_penalty))
    return _translate(model, batch, max_len, beam)[0]
