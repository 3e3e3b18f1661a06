"""The compiled programs of continuous batching: a slotted KV cache, one prefill per prompt
bucket, and one decode step for every slot at once.

The cache is `GPT.init_cache` stacked on a leading `slots` axis, each slot with its own `index`
(where its sequence stands). A prompt is prefilled into a fresh cache of the slot's capacity
and written over its slot, its index set back to its last token, which the next decode step
feeds again: the first new token comes out of the same cached step as every later one, as in
`zoo.decoding.stream`. The decode step feeds one token per slot (`gpt_step`, vmapped over the
slots) and chooses each slot's next token with that slot's own sampling numbers.

Prompts are right-padded to a power of two (`BUCKET_START` at least), so a server compiles one
prefill per bucket width and steady serving compiles nothing. The step's kind (`StepKind`:
which sampling filters and whether log-probabilities are wanted by any slot) is static; its
numbers are arrays, so new temperatures or seeds reuse the program. Every compile is counted
and logged (`Programs.compiles`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from zoo.decoding.generate import gpt_step
from zoo.decoding.sampling import filter_logits
from zoo.models.gpt import GPT
from zoo.nn.cache import KVCache

log = logging.getLogger("zoo.serving")

BUCKET_START = 16  # the narrowest prefill width: shorter prompts are padded to it


def bucket_width(length: int, capacity: int) -> int:
    """The prefill width of a prompt of `length` tokens: the next power of two (at least
    `BUCKET_START`), at most the slot's `capacity`."""
    width = BUCKET_START
    while width < length:
        width *= 2
    return min(width, capacity)


@dataclass(frozen=True)
class StepKind:
    """What the decode step computes beyond greedy tokens; static, so each kind compiles once."""

    sampled: bool = False  # some slot draws its token (temperature > 0)
    top_k: bool = False  # some slot filters by top-k
    top_p: bool = False  # some slot filters by top-p
    logprobs: int = 0  # how many top log-probabilities a slot wants at most (0: none)


@dataclass(frozen=True)
class SlotSampling:
    """Each slot's sampling numbers, as host arrays of `[slots]` (what the step reads)."""

    temperature: np.ndarray  # float32; 0 is greedy
    top_k: np.ndarray  # int32; the vocabulary size where a slot does not filter
    top_p: np.ndarray  # float32; 1 where a slot does not filter
    key_data: np.ndarray  # uint32 [slots, *key shape]: each slot's random key
    steps: np.ndarray  # int32: how many tokens each slot has chosen (draw i folds in i)


@dataclass(frozen=True)
class StepOutput:
    """What one decode step gives back to the host, per slot."""

    tokens: np.ndarray  # int32 [slots]: the chosen tokens
    logprobs: np.ndarray | None  # float32 [slots]: their log-probabilities (None: not asked)
    top_ids: np.ndarray | None  # int32 [slots, k]: the most likely ids
    top_logprobs: np.ndarray | None  # float32 [slots, k]: and their log-probabilities


def _choose(
    logits: Float[Array, " vocab"],
    key: Array,
    step: Int[Array, ""],
    temperature: Float[Array, ""],
    top_k: Int[Array, ""],
    top_p: Float[Array, ""],
    kind: StepKind,
) -> Int[Array, ""]:
    """One slot's next token: argmax when its temperature is 0, else a draw from the filtered
    distribution with the key `zoo.decoding.stream` uses for one row at step `step`."""
    greedy = jnp.argmax(logits).astype(jnp.int32)
    if not kind.sampled:
        return greedy
    draw_key = jax.random.split(jax.random.fold_in(key, step), 1)[0]
    filtered = filter_logits(
        logits,
        temperature=jnp.where(temperature > 0, temperature, 1.0),
        top_k=top_k if kind.top_k else None,
        top_p=top_p if kind.top_p else None,
    )
    drawn = jax.random.categorical(draw_key, filtered).astype(jnp.int32)
    return jnp.where(temperature > 0, drawn, greedy)


def _decode(params, caches, tokens, active, sampling, *, static, kind: StepKind):
    model = eqx.combine(params, static)
    logits, caches = gpt_step(model, tokens, caches)
    keys = jax.random.wrap_key_data(sampling["key_data"])
    choose = jax.vmap(_choose, in_axes=(0, 0, 0, 0, 0, 0, None))
    chosen = choose(
        logits, keys, sampling["steps"], sampling["temperature"], sampling["top_k"],
        sampling["top_p"], kind,
    )  # fmt: skip
    # a free slot runs too (one shape for all): keep its index at 0 so it never overflows
    caches = eqx.tree_at(lambda c: c.index, caches, jnp.where(active, caches.index, 0))
    extra: tuple[Array, ...] = ()
    if kind.logprobs:
        logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logprobs, chosen[:, None], axis=1)[:, 0]
        top_values, top_ids = jax.lax.top_k(logprobs, kind.logprobs)
        extra = (picked, top_ids.astype(jnp.int32), top_values)
    return chosen, extra, caches


def _prefill(params, caches, tokens, length, slot, *, static):
    model = eqx.combine(params, static)
    _, cache = model.prefill(tokens, caches.capacity, caches.keys.dtype)
    cache = eqx.tree_at(lambda c: c.index, cache, length - 1)
    return jax.tree.map(lambda whole, one: whole.at[slot].set(one), caches, cache)


class Programs:
    """The slotted cache of `slots` sequences of `capacity` positions, and the compiled
    prefill and decode step that work on it (the cache is donated: updated in place)."""

    def __init__(self, model: GPT, *, slots: int, capacity: int):
        self.model, self.slots, self.capacity = model, slots, capacity
        self.params, self.static = eqx.partition(model, eqx.is_array)
        self.caches: KVCache = self._empty()
        # the model's non-array parts are closed over: only its arrays are traced
        self._prefill = jax.jit(functools.partial(_prefill, static=self.static), donate_argnums=1)
        self._decode = jax.jit(
            functools.partial(_decode, static=self.static), donate_argnums=1, static_argnames="kind"
        )
        self.compiles: list[tuple[str, float]] = []  # (what, seconds), in order

    def _empty(self) -> KVCache:
        one = self.model.init_cache(self.capacity)
        return jax.tree.map(lambda leaf: jnp.zeros((self.slots, *leaf.shape), leaf.dtype), one)

    def reset(self) -> None:
        """A fresh, empty cache (after a failed call, whose donated cache may be gone)."""
        self.caches = self._empty()

    def prefill(self, slot: int, prompt: np.ndarray) -> None:
        """Write `prompt`'s keys and values into `slot`; its index points at the last token."""
        width = bucket_width(len(prompt), self.capacity)
        tokens = np.zeros((width,), np.int32)
        tokens[: len(prompt)] = prompt
        self.caches = self._counted(
            self._prefill, f"prefill of width {width}",
            self.params, self.caches, tokens, np.int32(len(prompt)), np.int32(slot),
        )  # fmt: skip

    def decode(
        self, tokens: np.ndarray, active: np.ndarray, sampling: SlotSampling, kind: StepKind
    ) -> StepOutput:
        """Feed each slot's token and choose its next one (free slots are computed, ignored)."""
        numbers = {
            "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "key_data": sampling.key_data, "steps": sampling.steps,
        }  # fmt: skip
        chosen, extra, self.caches = self._counted(
            self._decode, f"decode step ({kind})",
            self.params, self.caches, tokens, active, numbers, kind=kind,
        )  # fmt: skip
        if not extra:
            return StepOutput(np.asarray(chosen), None, None, None)
        picked, top_ids, top_values = (np.asarray(part) for part in extra)
        return StepOutput(np.asarray(chosen), picked, top_ids, top_values)

    def _counted(self, program: Callable, what: str, *args, **named):
        """`program(*args, **named)`, logging the compile when this call made one."""
        before = _cache_size(program)
        start = time.perf_counter()
        result = program(*args, **named)
        if _cache_size(program) != before:
            jax.block_until_ready(result)
            seconds = time.perf_counter() - start
            self.compiles.append((what, seconds))
            log.info("compiled the %s in %.2f s", what, seconds)
        return result


def _cache_size(program: Callable) -> int:
    """How many programs a jitted function has compiled (-1 where JAX does not say)."""
    size = getattr(program, "_cache_size", None)
    return int(size()) if callable(size) else -1
