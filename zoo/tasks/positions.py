"""The output head on the scored positions only: a batch's `loss_positions`, read by the tasks.

A batch may list, per row, the target positions its loss scores (`zoo.data.positions` builds
the list: ascending positions, then -1). `scored_only` gathers the features, targets and weights
of those positions, so the output head (`[positions, d_model] x [d_model, vocab]`) runs on them
alone: the same loss and gradients from a narrower matmul. A list that leaves out a position the
loss scores would silently drop it, so it is refused: `check_loss_positions` on the host (the
trainer's check of each batch), and inside `scored_only` on the device where the batch was not
checked on the host.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from zoo.nn.embedding import checked_on_host

FIX = "build it with zoo.data.positions.loss_positions from the batch's loss_mask (and segments)"


def scored_only(
    features: Float[Array, "rows seq d_model"],
    targets: Int[Array, "rows seq"],
    weight: Bool[Array, "rows seq"],
    positions: Int[Array, "rows capacity"],
) -> tuple[Float[Array, "rows capacity d_model"], Int[Array, "rows capacity"], Array]:
    """The features, targets and weights at `positions` (-1: none, weight 0). Refused on the
    device (where the batch was not checked on the host) when a scored position is missing."""
    listed = positions >= 0
    index = jnp.where(listed, positions, 0)
    picked = jnp.take_along_axis(weight, index, axis=1) & listed
    if not checked_on_host():
        picked = eqx.error_if(
            picked,
            jnp.sum(picked) != jnp.sum(weight),
            "loss_positions leaves out a target position the loss scores; " + FIX,
        )
    return (
        jnp.take_along_axis(features, index[..., None], axis=1),
        jnp.take_along_axis(targets, index, axis=1),
        picked,
    )


def check_loss_positions(positions: np.ndarray, scored: np.ndarray) -> None:
    """Refuse `positions` (`[rows, capacity]`) that leave out a target `scored`
    (`bool [rows, targets]`) or point past the last target."""
    positions = positions.reshape(-1, positions.shape[-1])
    scored = scored.reshape(-1, scored.shape[-1])
    if positions.max(initial=-1) >= scored.shape[1]:
        raise ValueError(
            f"batch['loss_positions'] holds {int(positions.max())}, past the last target "
            f"position {scored.shape[1] - 1}; list target positions t (predicting token t + 1)"
        )
    listed = np.zeros(scored.shape, bool)
    rows = np.broadcast_to(np.arange(len(positions))[:, None], positions.shape)
    listed[rows[positions >= 0], positions[positions >= 0]] = True
    missing = scored & ~listed
    if missing.any():
        row, column = np.argwhere(missing)[0]
        raise ValueError(
            f"batch['loss_positions'] leaves out target position {column} of row {row}, which "
            f"the loss scores; {FIX}"
        )
