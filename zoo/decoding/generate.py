"""Text generation with a GPT: KV-cached, batched, one compiled program per call shape.

Prompts are right-padded. Every prompt is prefilled into the cache in one pass; then each
sequence's cache index is set back to its own last prompt token, which is fed again as the
first decoding step. So each sequence continues at its own position, the first new token
overwrites the first padding slot, and later stale slots are invisible to causal attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.decoding.batching import TokenBatch, compact_left, pad_batch, sequence_lengths
from zoo.decoding.beam import beam_search
from zoo.decoding.loop import fill_token, sample_loop
from zoo.decoding.placement import decoding_layout, place_model, place_rows
from zoo.decoding.sampling import SamplingSettings
from zoo.models.gpt import GPT
from zoo.nn.attention import KVCache


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
def _sample(model, prompts, lengths, key, values, max_new_tokens):
    c = model.config
    caches = start_gpt_decoding(model, prompts, lengths, prompts.shape[1] + max_new_tokens - 1)
    tokens, _ = sample_loop(
        lambda tokens, caches: gpt_step(model, tokens, caches),
        caches,
        last_tokens(prompts, lengths),
        max_new_tokens=max_new_tokens,
        values=values,
        key=key,
        eos_id=c.end_ids,
        fill_id=fill_token(c.pad_id, c.eos_id),
    )
    return tokens


@eqx.filter_jit
def _beam(model, prompts, lengths, max_new_tokens, beam_size, alpha):
    c = model.config
    caches = start_gpt_decoding(model, prompts, lengths, prompts.shape[1] + max_new_tokens - 1)
    tokens, scores, _ = beam_search(
        lambda tokens, caches: gpt_step(model, tokens, caches),
        caches,
        last_tokens(prompts, lengths),
        beam_size=beam_size,
        max_len=max_new_tokens,
        eos_id=c.end_ids,
        fill_id=fill_token(c.pad_id, c.eos_id),
        alpha=alpha,
    )
    return tokens, scores


def _prepare(model, prompts, lengths, max_new_tokens, beam_size, layout, attention_mask=None):
    """Check the request; return the model, right-padded prompts and lengths placed for
    decoding (on `layout`'s mesh, or the default device without one)."""
    if not isinstance(model, GPT):
        raise TypeError(
            f"generate needs a zoo.GPT, got {type(model).__name__}; "
            "use zoo.translate for a Translator"
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
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
    return place_model(layout, model), *place_rows(layout, batch, found)


def beam_generate(
    model: GPT,
    prompts: TokenBatch,
    *,
    max_new_tokens: int,
    beam_size: int,
    length_penalty: float = 0.6,
    lengths: Int[Array, " batch"] | np.ndarray | Sequence[int] | None = None,
    mesh: Any = None,
    rules: Any = None,
) -> tuple[Int[Array, "batch max_new_tokens"], Float[Array, " batch"]]:
    """Beam search continuation of each prompt: the best new tokens and their scores.

    The score is the total log-probability of the new tokens divided by the GNMT length penalty
    `((5 + length) / 6) ** length_penalty`. `mesh` and `rules`: as in `generate`.
    """
    layout = decoding_layout(mesh, rules)
    model, prompts, lengths = _prepare(model, prompts, lengths, max_new_tokens, beam_size, layout)
    alpha = float(length_penalty)
    return _beam(model, prompts, lengths, max_new_tokens, beam_size, alpha)


def generate(
    model: GPT,
    prompts: TokenBatch,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: PRNGKeyArray | None = None,
    lengths: Int[Array, " batch"] | np.ndarray | Sequence[int] | None = None,
    attention_mask: np.ndarray | Sequence[Sequence[int]] | None = None,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    mesh: Any = None,
    rules: Any = None,
) -> Int[Array, "batch max_new_tokens"]:
    """Continue a batch of prompts with a GPT; returns only the new tokens.

    `prompts` is `[batch, seq]` right-padded with the config's `pad_id`, or a list of token
    lists (padded here). Each prompt's length is `lengths` if given, else its width minus its
    trailing pad tokens (a list's own lengths when the model has no `pad_id`). A batch padded on the left, as HuggingFace
    tokenizers return it for generation, comes with its `attention_mask` (1 = real token). `temperature=0` is greedy; otherwise tokens are drawn with `key` from
    the distribution filtered by `top_k` and `top_p`. `beam_size > 1` runs beam search instead
    (greedy only). A sequence ends at `eos_id` or any of the config's `stop_ids`; after its end
    the output holds `pad_id` (or `eos_id` when the model has no pad token). Compiles once per (batch, prompt width, max_new_tokens).

    On many devices, pass `mesh` (a `jax.sharding.Mesh` or a string like
    `"data=2,fsdp=2,tensor=2"`) and optionally `rules` (default `zoo.distributed.RULES`), as
    for `zoo.Trainer`: the model is put on the rules' shardings (a model already placed there,
    e.g. by `zoo.distributed.Layout.of(mesh).place(model)`, is used as it is, which saves a copy
    per call), the prompts are split by rows over `data x fsdp` when their number is a multiple
    of it and copied whole to every device otherwise, and the KV cache keeps the prompts' rows
    and its key/value heads split over `tensor`. The tokens are those of one device.
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    layout = decoding_layout(mesh, rules)
    model, prompts, lengths = _prepare(
        model, prompts, lengths, max_new_tokens, beam_size, layout, attention_mask=attention_mask
    )
    if beam_size > 1:
        if not settings.greedy:
            raise ValueError("beam search is deterministic: use temperature=0 with beam_size > 1")
        alpha = float(length_penalty)
        tokens, _ = _beam(model, prompts, lengths, max_new_tokens, beam_size, alpha)
        return tokens
    settings.check_key(key)
    values = settings.values()
    key = None if values is None else key
    return _sample(model, prompts, lengths, key, values, max_new_tokens)
