"""The token-by-token decoding loop shared by GPT generation and translation.

The loop knows nothing about models: it calls a batched `step(tokens, state) -> (logits,
state)` that feeds one token per sequence and returns the logits of the next one. It runs inside
`jax.lax.while_loop`, so a whole generation is one compiled program with no host round trip per
token, and it stops early once every sequence has produced `eos_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.decoding.sampling import choose_token

# step(tokens [batch], state) -> (logits [batch, vocab], state)
StepFn = Callable[[Int[Array, " batch"], Any], tuple[Float[Array, "batch vocab"], Any]]


EndIds = int | tuple[int, ...] | None  # the id(s) that end a sequence (Llama 3 has several)


def end_ids(eos: EndIds) -> tuple[int, ...]:
    """The end ids as a tuple (empty when nothing ends a sequence)."""
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def is_end(tokens: Int[Array, "*shape"], eos: EndIds) -> Array:
    """True where a token is one of the end ids."""
    ends = jnp.zeros(tokens.shape, bool)
    for end in end_ids(eos):
        ends = ends | (tokens == end)
    return ends


def fill_token(pad_id: int | None, eos_id: int | None) -> int:
    """What goes after a sequence's end: `pad_id`, else `eos_id` (0 if neither exists)."""
    if pad_id is not None:
        return pad_id
    return 0 if eos_id is None else eos_id


def sample_loop(
    step: StepFn,
    state: Any,
    first_tokens: Int[Array, " batch"],
    *,
    max_new_tokens: int,
    values: dict[str, Array] | None,
    key: PRNGKeyArray | None,
    eos_id: EndIds,
    fill_id: int,
) -> tuple[Int[Array, "batch new"], Int[Array, ""]]:
    """Feed `first_tokens`, then each chosen token, `max_new_tokens` times (or until all end).

    Returns the chosen tokens, with `fill_id` after each sequence's end (`eos_id`: one id or a
    tuple of ids), and the number of
    steps actually run. `values` selects greedy (None) or sampling (see `choose_token`); step i
    draws with `fold_in(key, i)`, split over the batch, so a key fixes the whole sample.
    """
    batch = first_tokens.shape[0]
    out = jnp.full((batch, max_new_tokens), fill_id, jnp.int32)
    finished = jnp.zeros((batch,), bool)
    choose = jax.vmap(choose_token, in_axes=(0, 0, None))

    def keep_going(carry):
        index, _, _, _, finished = carry
        return (index < max_new_tokens) & ~jnp.all(finished)

    def one_token(carry):
        index, tokens, state, out, finished = carry
        logits, state = step(tokens, state)
        keys = None if key is None else jax.random.split(jax.random.fold_in(key, index), batch)
        chosen = choose(logits, keys, values)
        chosen = jnp.where(finished, jnp.int32(fill_id), chosen)
        out = jax.lax.dynamic_update_slice(out, chosen[:, None], (jnp.int32(0), index))
        finished = finished | is_end(chosen, eos_id)
        return index + 1, chosen, state, out, finished

    start = (jnp.int32(0), first_tokens.astype(jnp.int32), state, out, finished)
    steps, _, _, out, _ = jax.lax.while_loop(keep_going, one_token, start)
    return out, steps
