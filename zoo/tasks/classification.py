"""Sequence classification: cross-entropy of the class logits, accuracy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, PRNGKeyArray

from zoo.tasks.base import (
    Classifies,
    Stats,
    Task,
    check_ids,
    example_keys,
    token_losses,
    weighted_stats,
)
from zoo.tasks.router_losses import with_router_losses


class Classification(Task[Classifies]):
    """Train a `zoo.Classifier` on `tokens [batch, seq]` and `labels [batch]`.

    Loss: mean cross-entropy per example (fp32). Metric: accuracy. Padding inside `tokens` is
    handled by the model (its `pad_id`); every example counts once. An optional
    `token_types [batch, seq]` is passed to the model (segment ids, e.g. for sentence pairs). A
    mixture-of-experts model adds its router losses (`zoo.tasks.router_losses`).
    """

    flavor = "classifier"
    metric_name = "accuracy"
    required: ClassVar[dict[str, str]] = {"tokens": "[batch, seq]", "labels": "[batch]"}
    optional: ClassVar[dict[str, str]] = {"token_types": "[batch, seq]"}

    def statistics(
        self,
        model: Classifies,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        tokens = jnp.asarray(batch["tokens"])
        labels = jnp.asarray(batch["labels"])
        token_types = batch.get("token_types")
        token_types = None if token_types is None else jnp.asarray(token_types)

        def one(tokens, token_types, key):
            return model.logits_and_router(tokens, None, token_types, key=key)

        logits, router = jax.vmap(one)(tokens, token_types, example_keys(key, tokens.shape[0]))
        objective, nll, correct = token_losses(logits, labels)
        stats = weighted_stats(objective, nll, correct, jnp.ones(labels.shape, bool))
        return with_router_losses(stats, router, model)

    def _check_values(self, batch: Mapping[str, np.ndarray], model: Classifies) -> None:
        config = model.config
        types = config.embedder.type_vocab_size
        check_ids("tokens", batch["tokens"], config.vocab_size, config.max_tokens)
        labels = batch["labels"]
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= config.num_classes:
            raise ValueError(
                f"batch['labels'] holds labels in [{low}, {high}] but the model has "
                f"num_classes={config.num_classes} (labels in [0, {config.num_classes})); "
                f"build the model with num_classes={high + 1} or fix the labels"
            )
        if "token_types" in batch:
            if batch["token_types"].shape != batch["tokens"].shape:
                raise ValueError(
                    f"batch['token_types'] must have the shape of batch['tokens'] "
                    f"{batch['tokens'].shape}, got {batch['token_types'].shape}"
                )
            if types == 0:
                raise ValueError(
                    "the batch has token_types but the model has none (embedder.type_vocab_size="
                    "0); build it with embedder.type_vocab_size > 0 or drop token_types from "
                    "the batch"
                )
            low, high = int(batch["token_types"].min()), int(batch["token_types"].max())
            if low < 0 or high >= types:
                raise ValueError(
                    f"batch['token_types'] must be in [0, {types}), got [{low}, {high}]"
                )
