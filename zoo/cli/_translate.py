"""Translating a batch for `zoo eval`: `zoo.decoding.translate` when installed, else greedy."""

from __future__ import annotations

import importlib.util
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int


def _greedy_one(model: Any, src: Int[Array, " src"], max_len: int) -> Int[Array, " out"]:
    config = model.config
    state = model.start_decoding(src, max_len)

    def step(carry, _):
        token, state, done = carry
        logits, state = model.decode_step(token[None], state)
        chosen = jnp.argmax(logits[-1]).astype(jnp.int32)
        chosen = jnp.where(done, jnp.int32(config.pad_id or 0), chosen)
        done = done | (chosen == config.eos_id)
        return (chosen, state, done), chosen

    start = (jnp.int32(config.bos_id), state, jnp.zeros((), bool))
    _, tokens = jax.lax.scan(step, start, None, length=max_len - 1)
    return tokens


@eqx.filter_jit
def _greedy(model: Any, src: Int[Array, "batch src"], max_len: int) -> Int[Array, "batch out"]:
    return jax.vmap(lambda one: _greedy_one(model, one, max_len))(src)


def translate_batch(model: Any, src: np.ndarray, *, max_len: int, beam_size: int) -> np.ndarray:
    """Target ids `[batch, <= max_len]` after bos; beam search needs `zoo.decoding`."""
    if importlib.util.find_spec("zoo.decoding") is not None:
        from zoo.decoding import translate

        return np.asarray(translate(model, src, beam_size=beam_size, max_len=max_len))
    if beam_size != 1:
        raise ValueError(
            f"--beam-size {beam_size} needs zoo.decoding (beam search); use --beam-size 1 "
            "(greedy decoding)"
        )
    return np.asarray(_greedy(model, jnp.asarray(src), max_len))


def cut_at_eos(ids: np.ndarray, eos_id: int) -> list[int]:
    """The ids before the first eos."""
    ids_list = [int(token) for token in ids]
    return ids_list[: ids_list.index(eos_id)] if eos_id in ids_list else ids_list
