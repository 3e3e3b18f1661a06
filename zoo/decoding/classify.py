"""Class probabilities for a batch of sequences with a Classifier."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int

from zoo.decoding.batching import TokenBatch, pad_batch, sequence_lengths
from zoo.decoding.placement import decoding_layout, place_model, place_rows
from zoo.distributed.layout import Layout
from zoo.models.classifier import Classifier


@eqx.filter_jit
def _probabilities(model, tokens, mask, token_types):
    logits = jax.vmap(lambda t, m, tt: model(t, m, tt))(tokens, mask, token_types)
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def classify(
    model: Classifier,
    token_batch: TokenBatch,
    mask: Bool[Array, "batch seq"] | np.ndarray | None = None,
    token_types: Int[Array, "batch seq"] | np.ndarray | None = None,
    *,
    mesh: Mesh | str | Layout | None = None,
) -> Float[Array, "batch classes"]:
    """Softmax of the class logits of every sequence (inference: no dropout).

    `token_batch` is `[batch, seq]` right-padded with `pad_id`, or a list of token lists (padded
    here). `mask` (True = real token) overrides the padding found from `pad_id`. With `mesh` (a
    `jax.sharding.Mesh`, a string like `"data=2"`, or a `zoo.distributed.Layout` with its
    rules) the model goes onto the rules' shardings and the rows are split over `data x fsdp`
    when their number is a multiple of it, else copied whole (as `zoo.generate`).
    """
    if not isinstance(model, Classifier):
        raise TypeError(f"classify needs a zoo.Classifier, got {type(model).__name__}")
    layout = decoding_layout(mesh)
    batch = pad_batch(token_batch, model.config.pad_id, what="token_batch")
    if mask is None:
        sequence_lengths(batch, model.config.pad_id, what="token_batch")  # rejects empty rows
    else:
        mask = np.asarray(mask, bool)
    tokens, mask, token_types = place_rows(layout, batch, mask, token_types)
    return _probabilities(place_model(layout, model), tokens, mask, token_types)
