"""Token-by-token decoding from Python: one compiled step per token, each token on the host as
soon as it is chosen (for streaming text to a terminal).

`zoo.generate` runs its whole loop inside one compiled `while_loop`, which is fastest but
returns nothing until it ends. Here the prompts are prefilled and the first token chosen in one
compiled call, then each further token is one compiled call of the cached step (`gpt_step`)
and the choice, so the caller sees every token as it comes and decides when to stop. Token `i`
is drawn with `fold_in(key, i)` split over the rows, as `zoo.generate` draws it: the same key
gives the same tokens.

Prompts are padded to a multiple of `WIDTH_STEP` positions and the cache holds the padded width
plus `max_new_tokens`, so a conversation that grows by a turn reuses the compiled programs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Int, PRNGKeyArray

from zoo.decoding.generate import gpt_step, last_tokens, start_gpt_decoding
from zoo.decoding.placement import decoding_layout
from zoo.decoding.sampling import SamplingSettings, choose_token, sampling_or_greedy
from zoo.decoding.search import placed
from zoo.distributed.layout import Layout
from zoo.models.gpt import GPT

WIDTH_STEP = 64  # prompts are padded to a multiple of this many positions


def _choose(
    logits: Array, key: PRNGKeyArray | None, index: Array, values: dict[str, Array] | None
) -> Int[Array, " rows"]:
    """Each row's next token; step `index` draws with `fold_in(key, index)` split over rows."""
    rows = logits.shape[0]
    keys = None if key is None else jax.random.split(jax.random.fold_in(key, index), rows)
    return jax.vmap(choose_token, in_axes=(0, 0, None))(logits, keys, values)


@eqx.filter_jit
def _start(model, prompts, lengths, key, values, capacity):
    caches = start_gpt_decoding(model, prompts, lengths, capacity)
    logits, caches = gpt_step(model, last_tokens(prompts, lengths), caches)
    return _choose(logits, key, jnp.int32(0), values), caches


@eqx.filter_jit
def _next(model, caches, tokens, key, index, values):
    logits, caches = gpt_step(model, tokens, caches)
    return _choose(logits, key, index, values), caches


def stream_tokens(
    model: GPT,
    prompts: Sequence[Sequence[int] | np.ndarray],
    *,
    max_new_tokens: int,
    sampling: SamplingSettings | None = None,
    key: PRNGKeyArray | None = None,
    stop_ids: Sequence[int] = (),
    mesh: Mesh | str | Layout | None = None,
) -> Iterator[np.ndarray]:
    """Yield `int32[rows]`, the next token of every prompt, one step at a time.

    It stops once every row has produced one of `stop_ids` (the model's `end_ids` always count)
    or after `max_new_tokens`, cut to what fits in `max_positions` with the longest prompt. A
    row that has ended keeps yielding its end token.

    Args:
        model: a `zoo.GPT`.
        prompts: the token ids of each prompt (ragged: each row is its own length).
        max_new_tokens: how many tokens to yield at most.
        sampling: how each token is chosen, as in `zoo.generate` (None is greedy).
        key: the random key of sampling, as in `zoo.generate`.
        stop_ids: more ids that end a row (a chat template's end of turn).
        mesh: where to decode, as in `zoo.generate`.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"decoding a conversation needs a zoo.GPT, got {type(model).__name__}")
    settings = sampling_or_greedy(sampling)
    settings.check_key(key)
    values = settings.values()
    key = None if values is None else key
    rows = [np.asarray(prompt, np.int32).reshape(-1) for prompt in prompts]
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError("every prompt needs at least one token")
    lengths = np.array([len(row) for row in rows], np.int32)
    limit, longest = model.config.max_positions, int(lengths.max())
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if longest >= limit:
        raise ValueError(
            f"the prompt has {longest} tokens and the model takes {limit} positions: no room "
            "to answer; shorten the conversation (in zoo chat: /reset)"
        )
    steps = min(max_new_tokens, limit - longest)  # prompt and reply fit max_positions
    width = min(-(-longest // WIDTH_STEP) * WIDTH_STEP, limit)
    capacity = min(limit, width + steps)
    batch = np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        batch[index, : len(row)] = row
    ends = np.array(sorted({*model.config.end_ids, *stop_ids}), np.int32)
    layout = decoding_layout(mesh)
    model, (placed_batch, placed_lengths) = placed(layout, model, batch, lengths)
    chosen, caches = _start(model, placed_batch, placed_lengths, key, values, capacity)
    finished = np.zeros(len(rows), bool)
    for index in range(steps):
        if index > 0:
            chosen, caches = _next(model, caches, chosen, key, jnp.int32(index), values)
        tokens = np.asarray(chosen)
        yield tokens
        finished |= np.isin(tokens, ends)
        if finished.all():
            return
