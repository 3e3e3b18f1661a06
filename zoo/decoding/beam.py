"""Beam search with the GNMT length penalty, for any model that decodes one token at a time.

Per source, `beam_size` hypotheses stay alive. Each step extends every alive hypothesis by every
token, ranks the `2 * beam_size` best extensions by total log-probability, moves those that end
with `eos_id` (among the `beam_size` best) to a pool of finished hypotheses scored by
`log_prob / ((5 + length) / 6) ** alpha`, and keeps the `beam_size` best that did not end. A
source is done once `beam_size` hypotheses have finished; at `max_len` the alive ones count as
finished too. With `beam_size=1` this is exactly greedy decoding.

The per-source bookkeeping (`Beams`, `extend_beams`) works on one source; `beam_search` runs the
batch in one `lax.while_loop` and reorders the decoder state (the KV cache) by parent beam.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PyTree

from zoo.decoding.loop import EndIds, State, Stopping, end_ids, is_end

# step(tokens [rows], state) -> (logits [rows, vocab], state), rows = batch x beams
BeamStepFn = Callable[[Int[Array, " rows"], State], tuple[Float[Array, "rows vocab"], State]]
# a pytree whose arrays each keep their rows on some axis (a decoder state, a source's memory)
Rows = TypeVar("Rows")
# where each leaf keeps its rows: an int, or a prefix pytree of ints as `jax.vmap`'s `in_axes`
RowAxes: TypeAlias = int | PyTree[int]


class Beams(eqx.Module):
    """The hypotheses of one source: alive ones by log-probability, finished ones by score."""

    alive_tokens: Int[Array, "beams max_len"]
    alive_log_probs: Float[Array, " beams"]
    finished_tokens: Int[Array, "beams max_len"]
    finished_scores: Float[Array, " beams"]
    num_finished: Int[Array, ""]

    @staticmethod
    def start(beam_size: int, max_len: int, fill_id: int) -> Beams:
        """One live empty hypothesis (the others start at -inf so step 0 expands it alone)."""
        alive = jnp.full((beam_size,), -jnp.inf, jnp.float32).at[0].set(0.0)
        empty = jnp.full((beam_size, max_len), fill_id, jnp.int32)
        finished = jnp.full((beam_size,), -jnp.inf, jnp.float32)
        return Beams(empty, alive, empty, finished, jnp.zeros((), jnp.int32))

    @property
    def done(self) -> Bool[Array, "*batch"]:
        """True once `beam_size` hypotheses have finished (per source when batched)."""
        return self.num_finished >= self.alive_log_probs.shape[-1]


def length_penalty(length: Int[Array, ""] | int, alpha: float) -> Float[Array, ""]:
    """GNMT's length normaliser `((5 + length) / 6) ** alpha` (1 when `alpha=0`)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def extend_beams(
    beams: Beams,
    log_probs: Float[Array, "beams vocab"],
    index: Int[Array, ""],
    *,
    eos_id: EndIds,
    alpha: float,
) -> tuple[Beams, Int[Array, " beams"], Int[Array, " beams"]]:
    """One beam-search step for one source: token `index` of every hypothesis.

    Returns the new beams, the token each alive beam must feed next, and the beam it came from
    (to reorder the decoder state).
    """
    beam_size, vocab = log_probs.shape
    totals = beams.alive_log_probs[:, None] + log_probs
    # (1 + #end ids) * beam_size candidates: each parent has that many ends, so at least
    # beam_size of the candidates never end here.
    candidates = (1 + max(len(end_ids(eos_id)), 1)) * beam_size
    top_totals, flat = jax.lax.top_k(totals.reshape(-1), candidates)
    parents = (flat // vocab).astype(jnp.int32)
    tokens = (flat % vocab).astype(jnp.int32)
    histories = beams.alive_tokens[parents].at[:, index].set(tokens)

    ends = is_end(tokens, eos_id)
    ranked_high = jnp.arange(candidates) < beam_size
    newly_finished = ends & ranked_high & jnp.isfinite(top_totals)
    new_scores = jnp.where(newly_finished, top_totals / length_penalty(index + 1, alpha), -jnp.inf)
    pool_scores = jnp.concatenate([beams.finished_scores, new_scores])
    pool_tokens = jnp.concatenate([beams.finished_tokens, histories])
    finished_scores, best = jax.lax.top_k(pool_scores, beam_size)

    alive_log_probs, keep = jax.lax.top_k(jnp.where(ends, -jnp.inf, top_totals), beam_size)
    new_beams = Beams(
        alive_tokens=histories[keep],
        alive_log_probs=alive_log_probs,
        finished_tokens=pool_tokens[best],
        finished_scores=finished_scores,
        num_finished=beams.num_finished + jnp.sum(newly_finished, dtype=jnp.int32),
    )
    return new_beams, tokens[keep], parents[keep]


def best_hypothesis(
    beams: Beams, *, alpha: float
) -> tuple[Int[Array, " max_len"], Float[Array, ""]]:
    """The highest-scoring hypothesis of one source and its score.

    A source that never finished `beam_size` hypotheses ran to `max_len`: its alive beams join
    the finished ones, scored at length `max_len`.
    """
    max_len = beams.alive_tokens.shape[-1]
    alive_scores = beams.alive_log_probs / length_penalty(max_len, alpha)
    alive_scores = jnp.where(beams.done, -jnp.inf, alive_scores)
    scores = jnp.concatenate([beams.finished_scores, alive_scores])
    tokens = jnp.concatenate([beams.finished_tokens, beams.alive_tokens])
    best = jnp.argmax(scores)
    return tokens[best], scores[best]


def map_rows(function: Callable[[Array, int], Array], tree: Rows, row_axes: RowAxes = 0) -> Rows:
    """Apply `function(leaf, axis)` to every leaf, `axis` being where the leaf keeps its rows.

    `row_axes` is an int or a prefix pytree of ints, like `jax.vmap`'s `in_axes`.
    """

    def on_subtree(axis, subtree):
        return jax.tree_util.tree_map(lambda leaf: function(leaf, axis), subtree)

    return jax.tree_util.tree_map(on_subtree, row_axes, tree)


def repeat_rows(tree: Rows, times: int, row_axes: RowAxes = 0) -> Rows:
    """Each row repeated `times` times in place: row `b` becomes rows `b * times + k`."""
    return map_rows(lambda leaf, axis: jnp.repeat(leaf, times, axis=axis), tree, row_axes)


def take_beams(tree: Rows, parents: Int[Array, "batch beams"], row_axes: RowAxes = 0) -> Rows:
    """Every leaf's rows reordered within each source: row `b * beams + k` becomes row
    `b * beams + parents[b, k]`.

    Gathering within a source (a batched gather) keeps the rows where they are when a mesh
    splits them by source: a gather over all rows would bring the whole KV cache to every
    device at every step.
    """
    batch, beams = parents.shape

    def reorder(leaf, axis):
        rows = jnp.moveaxis(leaf, axis, 0)
        grouped = rows.reshape(batch, beams, *rows.shape[1:])
        picked = jax.vmap(lambda source, order: source[order])(grouped, parents)
        return jnp.moveaxis(picked.reshape(rows.shape), 0, axis)

    return map_rows(reorder, tree, row_axes)


def _keep_where(done: Array, old: Rows, new: Rows) -> Rows:
    def pick(old_leaf, new_leaf):
        flag = done.reshape(done.shape + (1,) * (old_leaf.ndim - 1))
        return jnp.where(flag, old_leaf, new_leaf)

    return jax.tree_util.tree_map(pick, old, new)


def beam_search(
    step: BeamStepFn[State],
    state: State,
    first_tokens: Int[Array, " batch"],
    *,
    stopping: Stopping,
    beam_size: int,
    alpha: float,
    row_axes: RowAxes = 0,
) -> tuple[Int[Array, "batch max_len"], Float[Array, " batch"], Int[Array, ""]]:
    """Beam search for a batch of sources; returns best tokens, their scores and steps run.

    The decoder works on `batch * beam_size` rows, source `b`'s beams being rows
    `b * beam_size + k`. `state` holds one row per source; it is repeated per beam here and
    reordered by parent beam after every step. Tokens after a hypothesis' end are
    `stopping.fill_id`.

    Args:
        step: `step(tokens [rows], state) -> (logits [rows, vocab], state)`, one token a row.
        state: the decoder's state (a KV cache), one row per source.
        first_tokens: what each source feeds first (bos, or a prompt's last token).
        stopping: the longest hypothesis (`max_len`), the end ids and the fill id after them.
        beam_size: how many hypotheses stay alive per source.
        alpha: the GNMT length penalty's exponent (`length_penalty`).
        row_axes: where each leaf of `state` keeps its rows: an int or a prefix pytree of ints,
            as `jax.vmap`'s `in_axes`.
    """
    max_len, eos_id, fill_id = stopping.max_len, stopping.eos_id, stopping.fill_id
    batch = first_tokens.shape[0]
    start = Beams.start(beam_size, max_len, fill_id)
    beams = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (batch, *x.shape)), start)
    tokens = jnp.repeat(first_tokens.astype(jnp.int32), beam_size)
    state = repeat_rows(state, beam_size, row_axes)
    extend = jax.vmap(
        lambda b, lp, i: extend_beams(b, lp, i, eos_id=eos_id, alpha=alpha), in_axes=(0, 0, None)
    )

    def keep_going(carry):
        index, _, _, beams = carry
        return (index < max_len) & ~jnp.all(beams.done)

    def one_token(carry):
        index, tokens, state, beams = carry
        logits, state = step(tokens, state)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        log_probs = log_probs.reshape(batch, beam_size, -1)
        new_beams, new_tokens, parents = extend(beams, log_probs, index)
        # Sources already done keep their beams; their (ignored) state evolves freely.
        new_beams = _keep_where(beams.done, beams, new_beams)
        state = take_beams(state, parents, row_axes)
        return index + 1, new_tokens.reshape(-1), state, new_beams

    steps, _, _, beams = jax.lax.while_loop(
        keep_going, one_token, (jnp.int32(0), tokens, state, beams)
    )
    best_tokens, best_scores = jax.vmap(lambda b: best_hypothesis(b, alpha=alpha))(beams)
    return best_tokens, best_scores, steps
