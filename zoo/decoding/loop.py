"""The token-by-token decoding loop shared by GPT generation and translation.

The loop knows nothing about models: it calls a batched `step(tokens, state) -> (logits,
state)` that feeds one token per sequence and returns the logits of the next one. It runs inside
`jax.lax.while_loop`, so a whole generation is one compiled program with no host round trip per
token, and it stops early once every sequence has produced `eos_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.decoding.sampling import choose_token

# what a decoding step carries from one token to the next (a KV cache, a pytree)
State = TypeVar("State")
# step(tokens [batch], state) -> (logits [batch, vocab], state)
StepFn = Callable[[Int[Array, " batch"], State], tuple[Float[Array, "batch vocab"], State]]


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


@dataclass(frozen=True)
class Stopping:
    """When a decoding loop stops, and what a sequence holds after its end.

    A loop runs at most `max_len` steps, and fewer once every sequence has produced one of
    `eos_id` (one id, a tuple of ids as Llama 3 has, or None: nothing ends a sequence). After
    its end a sequence holds `fill_id`. Hashable: a jitted function takes it as a static value.
    """

    max_len: int
    eos_id: EndIds = None
    fill_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_len, int) or self.max_len < 1:
            raise ValueError(f"max_len must be a positive integer, got {self.max_len!r}")
        if isinstance(self.eos_id, list):  # a list read from JSON: keep the record hashable
            object.__setattr__(self, "eos_id", tuple(self.eos_id))


def sample_loop(
    step: StepFn[State],
    state: State,
    first_tokens: Int[Array, " batch"],
    *,
    stopping: Stopping,
    values: dict[str, Array] | None = None,
    key: PRNGKeyArray | None = None,
) -> tuple[Int[Array, "batch new"], Int[Array, ""]]:
    """Feed `first_tokens`, then each chosen token, `stopping.max_len` times (or until all end).

    Returns the chosen tokens, with `stopping.fill_id` after each sequence's end, and the number
    of steps actually run. Step i draws with `fold_in(key, i)`, split over the batch, so a key
    fixes the whole sample.

    Args:
        step: `step(tokens [batch], state) -> (logits [batch, vocab], state)`, one token a row.
        state: what `step` carries from one token to the next (a KV cache).
        first_tokens: the token each sequence feeds first.
        stopping: how many tokens at most, the end ids, and what fills a row after its end.
        values: None for greedy, else `SamplingSettings.values()` (see `choose_token`).
        key: the random key of sampling; None when greedy.
    """
    max_new_tokens, eos_id, fill_id = stopping.max_len, stopping.eos_id, stopping.fill_id
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
