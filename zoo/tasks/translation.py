"""Sequence-to-sequence translation: teacher-forced cross-entropy, token accuracy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, PRNGKeyArray

from zoo.tasks.base import (
    Stats,
    Task,
    Translates,
    check_ids,
    example_keys,
    target_weights,
)
from zoo.tasks.router_losses import with_router_losses
from zoo.tasks.vocab_loss import vocab_statistics


class Translation(Task[Translates]):
    """Train a `zoo.Translator` on `src [batch, src]` and `tgt [batch, tgt]` (bos .. eos pad).

    Teacher forcing: the decoder reads `tgt[:, :-1]` and is scored on `tgt[:, 1:]`; targets
    equal to `pad_id` are not scored. `label_smoothing` (the paper uses 0.1) mixes the one-hot
    reference with a uniform distribution over the target vocabulary; the reported perplexity
    stays the plain one. Metric: token accuracy over scored target tokens. A mixture-of-experts
    model adds its router losses (`zoo.tasks.router_losses`).
    """

    flavor = "translator"
    metric_name = "token_accuracy"
    required: ClassVar[dict[str, str]] = {"src": "[batch, src]", "tgt": "[batch, tgt]"}

    def __init__(self, label_smoothing: float = 0.0):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = float(label_smoothing)

    def statistics(
        self,
        model: Translates,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        src = jnp.asarray(batch["src"])
        tgt = jnp.asarray(batch["tgt"])
        inputs, targets = tgt[:, :-1], tgt[:, 1:]

        def one(src, tgt, key):
            return model.features_and_router(src, tgt, key=key)

        features, router = jax.vmap(one)(src, inputs, example_keys(key, src.shape[0]))
        weight = target_weights(targets, model.config.pad_id)
        stats = vocab_statistics(
            model.output_head, features, targets, weight, label_smoothing=self.label_smoothing
        )
        return with_router_losses(stats, router, model)

    def _check_values(self, batch: Mapping[str, np.ndarray], model: Translates) -> None:
        config = model.config
        check_ids("src", batch["src"], config.vocab_size, config.max_positions)
        check_ids("tgt", batch["tgt"], config.tgt_vocab, config.max_positions, shifted=True)
