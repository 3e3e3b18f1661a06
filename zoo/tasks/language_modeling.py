"""Causal language modelling: next-token cross-entropy, perplexity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from zoo.tasks.base import (
    LanguageModel,
    Stats,
    Task,
    check_ids,
    example_keys,
    target_weights,
)
from zoo.tasks.positions import check_loss_positions, scored_only
from zoo.tasks.router_losses import with_router_losses
from zoo.tasks.vocab_loss import CHUNK_BYTES, vocab_statistics

# float32 logits alive at once on a CPU: there memory, not the matmul's size, is what a smaller
# chunk costs (SmolLM2's LoRA step: 1.84 -> 1.51 GB of temporaries at 8 x 127 tokens); a GPU
# keeps the larger default chunks, which keep its matmuls large
CPU_CHUNK_BYTES = 32 << 20


def loss_chunk_bytes() -> int:
    """The float32 logits `LanguageModeling` holds at once on this platform."""
    return CPU_CHUNK_BYTES if jax.default_backend() == "cpu" else CHUNK_BYTES


class LanguageModeling(Task[LanguageModel]):
    """Train a `zoo.GPT` on `tokens [batch, seq]`: position t predicts token t+1.

    The model reads `tokens[:, :-1]` and is scored on `tokens[:, 1:]`. Targets equal to the
    model's `pad_id` are not scored (with `pad_id=None` every target is). An optional
    `loss_mask [batch, seq]` (1 = score, 0 = skip), aligned with `tokens`, restricts the loss
    further, e.g. to the answer of a prompt/answer pair. Optional `segments [batch, seq]` pack
    several documents into one row (`GPT(tokens, segments=...)`: each attends to itself only,
    positions restart); a document's first token is not scored as the continuation of the
    previous one, so a packed row gives the loss of its documents run one by one. Optional
    `loss_positions [batch, capacity]` (`zoo.data.positions`: each row's scored target positions,
    then -1) runs the output head on those positions only: the same loss from a narrower head;
    a scored position missing from it is refused. Loss: mean cross-entropy per scored
    token (fp32, a chunk of positions at a time: `zoo.tasks.vocab_loss`). Metric: perplexity, `exp(loss)`.
    A mixture-of-experts model adds its router losses (`zoo.tasks.router_losses`).
    """

    flavor = "gpt"
    metric_name = "perplexity"
    lower_is_better = True
    required: ClassVar[dict[str, str]] = {"tokens": "[batch, seq]"}
    optional: ClassVar[dict[str, str]] = {
        "loss_mask": "[batch, seq]",
        "segments": "[batch, seq]",
        "loss_positions": "[batch, capacity]",
    }

    def statistics(
        self,
        model: LanguageModel,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        tokens = jnp.asarray(batch["tokens"])
        inputs, targets = tokens[:, :-1], tokens[:, 1:]

        segments = None if "segments" not in batch else jnp.asarray(batch["segments"])

        def one(tokens, segments, key):
            return model.features_and_router(tokens, segments=segments, key=key)

        read = None if segments is None else segments[:, :-1]
        features, router = jax.vmap(one)(inputs, read, example_keys(key, tokens.shape[0]))
        weight = target_weights(targets, model.config.pad_id)
        if segments is not None:  # the first token of a document is not predicted from the last
            weight = weight & (segments[:, 1:] == segments[:, :-1])
        if "loss_mask" in batch:
            weight = weight & (jnp.asarray(batch["loss_mask"])[:, 1:] != 0)
        if "loss_positions" in batch:
            features, targets, weight = scored_only(
                features, targets, weight, jnp.asarray(batch["loss_positions"])
            )
        head = model.output_head
        stats = vocab_statistics(head, features, targets, weight, chunk_bytes=loss_chunk_bytes())
        return with_router_losses(stats, router, model)

    def metric(self, stats: Stats) -> Float[Array, ""]:
        return stats.perplexity

    def _check_values(self, batch: Mapping[str, np.ndarray], model: LanguageModel) -> None:
        config = model.config
        check_ids("tokens", batch["tokens"], config.vocab_size, config.max_positions, shifted=True)
        if "loss_positions" in batch:
            targets = batch["tokens"][:, 1:]
            scored = (
                np.ones(targets.shape, bool) if config.pad_id is None else targets != config.pad_id
            )
            if "segments" in batch:
                scored &= batch["segments"][:, 1:] == batch["segments"][:, :-1]
            if "loss_mask" in batch:
                scored &= batch["loss_mask"][:, 1:] != 0
            check_loss_positions(batch["loss_positions"], scored)
        for name in ("loss_mask", "segments"):
            if name in batch and batch[name].shape != batch["tokens"].shape:
                raise ValueError(
                    f"batch[{name!r}] must have the shape of batch['tokens'] "
                    f"{batch['tokens'].shape}, got {batch[name].shape}"
                )
