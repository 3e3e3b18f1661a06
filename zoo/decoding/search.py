"""What GPT generation and translation share: the checks of a request's numbers, the placement
of the model and its rows, and one decoding run over a step function (sampled or greedy with
`sample_loop`, or `beam_search`).

`zoo.decoding.generate` and `zoo.decoding.translate` differ only in how they start (a prefilled
prompt cache and its last tokens; an encoded source and `bos_id`) and in the step they feed;
from there both call `decode`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.decoding.beam import beam_search
from zoo.decoding.loop import State, StepFn, Stopping, sample_loop
from zoo.decoding.placement import Model, RowArray, place_model, place_rows
from zoo.distributed.layout import Layout


class Beam(NamedTuple):
    """Beam search's two numbers, as `beam_generate` and `beam_translate` take them."""

    size: int
    length_penalty: float


def positive(name: str, value: object) -> None:
    """Refuse a count (`max_new_tokens`, `max_len`, `beam_size`) that is not an integer >= 1."""
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def placed(
    layout: Layout | None, model: Model, *rows: RowArray
) -> tuple[Model, tuple[jax.Array, ...]]:
    """The model on `layout`'s shardings, and each `[batch, ...]` array split by rows (see
    `zoo.decoding.placement`); without a layout, on the default device."""
    return place_model(layout, model), place_rows(layout, *rows)


def decode(
    step: StepFn[State],
    state: State,
    first_tokens: Int[Array, " batch"],
    stopping: Stopping,
    *,
    beam: Beam | None = None,
    values: dict[str, Array] | None = None,
    key: PRNGKeyArray | None = None,
) -> tuple[Int[Array, "batch max_len"], Float[Array, " batch"] | None]:
    """The tokens of one decoding run, and the beam scores (None without a beam).

    Call it inside a jitted function (`beam` is static there; `values` and `key` are traced).

    Args:
        step: `step(tokens [rows], state) -> (logits [rows, vocab], state)`.
        state: the decoder's state (its KV cache), one row per sequence.
        first_tokens: the token each sequence feeds first.
        stopping: the most tokens, the end ids, and what fills a row after its end.
        beam: beam search's size and length penalty; None for one token at a time.
        values: without a beam, None for greedy or `SamplingSettings.values()`.
        key: the random key of sampling (None when greedy).
    """
    if beam is None:
        tokens, _ = sample_loop(
            step, state, first_tokens, stopping=stopping, values=values, key=key
        )
        return tokens, None
    tokens, scores, _ = beam_search(
        step,
        state,
        first_tokens,
        stopping=stopping,
        beam_size=beam.size,
        alpha=beam.length_penalty,
    )
    return tokens, scores
