"""Sampling a group of completions per prompt in one compiled call: what RL from rewards draws.

`sample_groups` repeats each prompt `num_generations` times, prefills every row's KV cache in one
pass and samples all rows token by token in one `lax.while_loop` (`zoo.decoding.loop`), so a
whole rollout is one program, compiled once per (rows, prompt width, completion width, which
sampling filters). A row stops at any of `end_ids` (the end of turn of a chat template, the
model's end ids), and holds `fill_id` after it.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from zoo.decoding.generate import gpt_step, last_tokens, start_gpt_decoding
from zoo.decoding.loop import Stopping, sample_loop
from zoo.decoding.sampling import SamplingSettings
from zoo.models.gpt import GPT


@eqx.filter_jit
def _sample(model, prompts, lengths, stopping, values, key):
    caches = start_gpt_decoding(model, prompts, lengths, prompts.shape[1] + stopping.max_len - 1)
    step = lambda tokens, caches: gpt_step(model, tokens, caches)  # noqa: E731
    first = last_tokens(prompts, lengths)
    tokens, _ = sample_loop(step, caches, first, stopping=stopping, values=values, key=key)
    return tokens


def sample_groups(
    model: GPT,
    prompts: Int[Array, "prompts seq"] | np.ndarray,
    lengths: Int[Array, " prompts"] | np.ndarray,
    *,
    num_generations: int,
    stopping: Stopping,
    sampling: SamplingSettings,
    key: PRNGKeyArray,
) -> Int[Array, "rows max_len"]:
    """`num_generations` sampled continuations of each prompt, prompt by prompt: row `r`
    continues prompt `r // num_generations`.

    Args:
        model: a `zoo.GPT` (with LoRA adapters, they take part).
        prompts: right-padded prompt ids.
        lengths: each prompt's real tokens.
        num_generations: completions per prompt.
        stopping: the most tokens of a completion (`max_len`), the ids that end one (kept in
            it) and what follows its end (`zoo.decoding.Stopping`).
        sampling: temperature, top-k and top-p (greedy is refused: a group would be one answer
            repeated).
        key: the random key of this draw.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"sample_groups needs a zoo.GPT, got {type(model).__name__}")
    if sampling.greedy:
        raise ValueError("a group of completions is sampled: give a temperature above 0")
    prompts, lengths = np.asarray(prompts, np.int32), np.asarray(lengths, np.int32)
    width = prompts.shape[1]
    if width + stopping.max_len > model.config.max_positions:
        raise ValueError(
            f"prompts of {width} tokens plus {stopping.max_len} completion tokens exceed the "
            f"model's max_positions={model.config.max_positions}: shorten the prompts or the "
            "completions"
        )
    rows = np.repeat(prompts, num_generations, axis=0)
    row_lengths = np.repeat(lengths, num_generations, axis=0)
    values = sampling.values()
    return _sample(model, jnp.asarray(rows), jnp.asarray(row_lengths), stopping, values, key)
