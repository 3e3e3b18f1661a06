"""Text generation with a GPT: KV-cached, batched, one compiled program per call shape.

Prompts are right-padded. Every prompt is prefilled into the cache in one pass; then each
sequence's cache index is set back to its own last prompt token, which is fed again as the
first decoding step. So each sequence continues at its own position, the first new token
overwrites the first padding slot, and later stale slots are invisible to causal attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.decoding.batching import (
    PromptBatch,
    compact_left,
    encoding_parts,
    pad_batch,
    sequence_lengths,
)
from zoo.decoding.loop import Stopping, fill_token
from zoo.decoding.placement import decoding_layout
from zoo.decoding.sampling import SamplingSettings, sampling_or_greedy
from zoo.decoding.search import Beam, decode, placed, positive
from zoo.distributed.layout import Layout
from zoo.models.gpt import GPT
from zoo.nn.cache import KVCache

Lengths = Int[Array, " batch"] | np.ndarray | Sequence[int]


def start_gpt_decoding(
    model: GPT, prompts: Int[Array, "batch seq"], lengths: Int[Array, " batch"], max_len: int
) -> KVCache:
    """Prefill a cache of `max_len` positions per prompt; each index points at its last token.

    Feeding `prompts[b, lengths[b] - 1]` next (see `gpt_step`) gives the first new token's logits.
    The caches come back stacked on a leading `batch` axis.
    """

    def prefill(tokens, length):
        _, cache = model.prefill(tokens, max_len)
        return eqx.tree_at(lambda c: c.index, cache, length - 1)

    return jax.vmap(prefill)(prompts, lengths)


def gpt_step(
    model: GPT, tokens: Int[Array, " rows"], caches: KVCache
) -> tuple[Float[Array, "rows vocab"], KVCache]:
    """Feed one token per sequence; returns the next-token logits and the grown caches."""

    def one(token, cache):
        logits, cache = model.extend(token[None], cache)
        return logits[0], cache

    return jax.vmap(one)(tokens, caches)


def last_tokens(prompts: Int[Array, "batch seq"], lengths: Int[Array, " batch"]) -> Array:
    return jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]


@eqx.filter_jit
def _generate(model, prompts, lengths, max_new_tokens, beam, values, key):
    c = model.config
    caches = start_gpt_decoding(model, prompts, lengths, prompts.shape[1] + max_new_tokens - 1)
    stopping = Stopping(max_new_tokens, c.end_ids, fill_token(c.pad_id, c.eos_id))
    step = lambda tokens, caches: gpt_step(model, tokens, caches)  # noqa: E731
    first = last_tokens(prompts, lengths)
    return decode(step, caches, first, stopping, beam=beam, values=values, key=key)


def _prepare(model, encoding, lengths, max_new_tokens, layout):
    """Check the request; return the model, right-padded prompts and lengths placed for
    decoding (on `layout`'s mesh, or the default device without one). `encoding` is the
    prompts and their attention mask (or None), from `encoding_parts`."""
    if not isinstance(model, GPT):
        raise TypeError(
            f"generate needs a zoo.GPT, got {type(model).__name__}; "
            "use zoo.translate for a Translator"
        )
    positive("max_new_tokens", max_new_tokens)
    prompts, attention_mask = encoding
    if lengths is None and model.config.pad_id is None and isinstance(prompts, list | tuple):
        lengths = [len(row) for row in prompts]  # no pad id to find them by: the rows' own
    batch = pad_batch(prompts, model.config.pad_id, ragged=lengths is not None)
    if attention_mask is not None:
        if lengths is not None and not isinstance(prompts, list | tuple):
            raise ValueError("pass either lengths or attention_mask, not both")
        batch, lengths = compact_left(batch, attention_mask)
    found = sequence_lengths(batch, model.config.pad_id, lengths)
    width, limit = batch.shape[1], model.config.max_positions
    if width + max_new_tokens > limit:
        raise ValueError(
            f"prompts of {width} tokens plus max_new_tokens={max_new_tokens} exceed the "
            f"model's max_positions={limit}; prompts may be at most {limit - max_new_tokens} "
            "tokens long: shorten them or generate fewer tokens"
        )
    model, (batch, found) = placed(layout, model, batch, found)
    return model, batch, found


def beam_generate(
    model: GPT,
    prompts: PromptBatch,
    *,
    max_new_tokens: int,
    beam_size: int,
    length_penalty: float = 0.6,
    lengths: Lengths | None = None,
    mesh: Mesh | str | Layout | None = None,
) -> tuple[Int[Array, "batch max_new_tokens"], Float[Array, " batch"]]:
    """Beam search continuation of each prompt: the best new tokens and their scores.

    The score is the total log-probability of the new tokens divided by the GNMT length penalty
    `((5 + length) / 6) ** length_penalty`. With `beam_size=1` the tokens are greedy's.

    Args:
        model: a `zoo.GPT`.
        prompts: as in `generate` (a batch of token ids, or a tokenizer's encoding).
        max_new_tokens: how many tokens to add to each prompt at most.
        beam_size: how many hypotheses stay alive per prompt.
        length_penalty: the exponent of the GNMT length penalty (0 ranks by log-probability).
        lengths: each prompt's length, as in `generate`.
        mesh: where to decode, as in `generate`.
    """
    positive("beam_size", beam_size)
    layout = decoding_layout(mesh)
    model, batch, found = _prepare(model, encoding_parts(prompts), lengths, max_new_tokens, layout)
    beam = Beam(beam_size, float(length_penalty))
    return _generate(model, batch, found, max_new_tokens, beam, None, None)


def generate(
    model: GPT,
    prompts: PromptBatch,
    *,
    max_new_tokens: int,
    sampling: SamplingSettings | None = None,
    key: PRNGKeyArray | None = None,
    lengths: Lengths | None = None,
    mesh: Mesh | str | Layout | None = None,
) -> Int[Array, "batch max_new_tokens"]:
    """Continue a batch of prompts with a GPT; returns only the new tokens.

    A sequence ends at `eos_id` or any of the config's `stop_ids`; after its end the output
    holds `pad_id` (or `eos_id` when the model has no pad token). Compiles once per (batch,
    prompt width, max_new_tokens, which sampling filters); new sampling numbers reuse it.

    On many devices the model is put on the rules' shardings (a model already placed there,
    e.g. by `zoo.distributed.Layout.of(mesh).place(model)`, is used as it is, which saves a
    copy per call), the prompts are split by rows over `data x fsdp` when their number is a
    multiple of it and copied whole to every device otherwise, and the KV cache keeps the
    prompts' rows and its key/value heads split over `tensor`. The tokens are those of one
    device.

    Args:
        model: a `zoo.GPT`.
        prompts: `[batch, seq]` token ids right-padded with the config's `pad_id`, or a list of
            token lists (padded here), or a tokenizer's encoding: a mapping with `input_ids`
            and `attention_mask` (1 = real token), padded on either side, as HuggingFace
            tokenizers return it for generation.
        max_new_tokens: how many tokens to add to each prompt at most.
        sampling: how each token is chosen (`SamplingSettings`: temperature, top-k, top-p);
            None (or `temperature=0`) is greedy.
        key: the random key the tokens are drawn with; needed when sampling.
        lengths: each prompt's length, when a prompt really ends with the pad token (by default
            its width minus its trailing pad tokens; a list's own lengths when the model has
            no `pad_id`).
        mesh: where to decode on many devices: a `jax.sharding.Mesh`, a string like
            `"data=2,fsdp=2,tensor=2"` (as for `zoo.Trainer`), or a `zoo.distributed.Layout`
            for partition rules other than `zoo.distributed.RULES`; None is one device.
    """
    settings = sampling_or_greedy(sampling)
    layout = decoding_layout(mesh)
    model, batch, found = _prepare(model, encoding_parts(prompts), lengths, max_new_tokens, layout)
    settings.check_key(key)
    values = settings.values()
    key = None if values is None else key
    return _generate(model, batch, found, max_new_tokens, None, values, key)[0]
