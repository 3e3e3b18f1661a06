"""Reward models: Bradley-Terry on pairs of answers, as TRL's `RewardTrainer`.

The batch is the one of `zoo.tasks.Preference` (`zoo.data.preference_data`): each pair's
chosen and rejected rows, prompt and answer, with their lengths; the model scores each whole
row with one number. The loss per pair is `-log sigmoid(r_chosen - r_rejected - margin)`, the
`margin` (`float32[batch]`) optional, plus `center_rewards * (r_chosen + r_rejected) ** 2`
where set (rewards near zero); both averaged over pairs. Metrics, TRL's names: `accuracy` (the
headline: pairs whose chosen row scores higher), `margin` (mean `r_chosen - r_rejected`),
`mean_reward` (over every row), and `rewards/chosen`, `rewards/rejected`.

A model is a `zoo.Classifier` with one class (the pooled first token, as BERT's sequence
classifier) or a `zoo.GPT` with a score head of one output read at the last real token (as
`LlamaForSequenceClassification`; `zoo.models.with_score_head` adds one to a language model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float, PRNGKeyArray

from zoo.models.classifier import Classifier
from zoo.models.gpt import GPT
from zoo.nn.moe import RouterStats
from zoo.tasks.base import Stats, Task, check_ids, example_keys
from zoo.tasks.router_losses import with_router_losses

MARGIN_KEY = "margin"
RewardModel = Classifier | GPT


def _rows(values: jax.Array) -> jax.Array:
    """`[batch, 2, ...]` -> `[2 * batch, ...]`: every chosen row, then every rejected row."""
    return jnp.concatenate([values[:, 0], values[:, 1]], axis=0)


def pair_rewards(
    model: RewardModel, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None = None
) -> tuple[Float[jax.Array, "batch 2"], RouterStats | None]:
    """`(rewards [batch, 2], router statistics)`: each row's score, one forward pass over the
    `2 * batch` rows, chosen rows first."""
    tokens = _rows(jnp.asarray(batch["tokens"]))
    lengths = _rows(jnp.asarray(batch["lengths"]))
    real = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    keys = example_keys(key, tokens.shape[0])
    if isinstance(model, GPT):

        def one(tokens, mask, key):
            return model.scores_and_router(tokens, mask, key=key)
    else:

        def one(tokens, mask, key):
            return model.logits_and_router(tokens, mask, None, key=key)

    scores, router = jax.vmap(one)(tokens, real, keys)
    rewards = scores[:, 0].astype(jnp.float32)
    half = tokens.shape[0] // 2
    return jnp.stack([rewards[:half], rewards[half:]], axis=1), router


class RewardModeling(Task[RewardModel]):
    """Train a reward model on chosen/rejected pairs (see the module doc).

    ```python
    model = zoo.models.with_score_head(zoo.from_pretrained("HuggingFaceTB/SmolLM2-135M"))
    task = zoo.tasks.RewardModeling()
    model, history = zoo.Trainer(task, zoo.train.adamw(lr=1e-5)).fit(model, pairs.train, ...)
    ```

    Args:
        center_rewards: TRL's `center_rewards_coefficient`: weight of the mean of
            `(r_chosen + r_rejected) ** 2` added to the loss (None or 0: none).
    """

    flavor = "classifier"
    metric_name = "accuracy"
    lower_is_better = False
    required: ClassVar[dict[str, str]] = {"tokens": "[batch, 2, seq]", "lengths": "[batch, 2]"}

    def __init__(self, *, center_rewards: float | None = None):
        if center_rewards is not None and not center_rewards >= 0:
            raise ValueError(f"center_rewards must be >= 0 or None, got {center_rewards}")
        self.center_rewards = center_rewards

    def statistics(
        self,
        model: RewardModel,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        rewards, router = pair_rewards(model, batch, key=key)
        chosen, rejected = rewards[:, 0], rewards[:, 1]
        difference = chosen - rejected
        shifted = difference
        if MARGIN_KEY in batch:
            shifted = difference - jnp.asarray(batch[MARGIN_KEY], jnp.float32)
        loss_sum = -jnp.sum(jax.nn.log_sigmoid(shifted))
        if self.center_rewards:
            loss_sum = loss_sum + self.center_rewards * jnp.sum((chosen + rejected) ** 2)
        shown = jax.lax.stop_gradient(rewards)
        stats = Stats(
            loss_sum=loss_sum,
            nll_sum=jax.lax.stop_gradient(-jnp.sum(jax.nn.log_sigmoid(difference))),
            weight=jnp.asarray(rewards.shape[0], jnp.float32),
            correct=jnp.sum((chosen > rejected).astype(jnp.float32)),
            extra={
                "margin": jnp.sum(shown[:, 0] - shown[:, 1]),
                "mean_reward": jnp.sum(shown) / 2.0,
                "rewards/chosen": jnp.sum(shown[:, 0]),
                "rewards/rejected": jnp.sum(shown[:, 1]),
            },
        )
        return with_router_losses(stats, router, model)

    def check_model(self, model: object) -> None:
        if isinstance(model, Classifier):
            classes = model.config.num_classes
            if classes != 1:
                raise TypeError(
                    f"a reward model scores with one output; this classifier has num_classes="
                    f"{classes}: build it with num_classes=1 (zoo train: --num-classes 1)"
                )
            return
        if isinstance(model, GPT):
            scores = model.config.head.scores
            if scores != 1:
                raise TypeError(
                    f"a reward model scores with one output; this GPT has head.scores={scores}: "
                    "add one with zoo.models.with_score_head(model)"
                )
            return
        raise TypeError(
            "RewardModeling trains a zoo.Classifier with num_classes=1 or a zoo.GPT with a score "
            f"head (zoo.models.with_score_head), got {type(model).__name__}"
        )

    def num_tokens(self, batch: Mapping[str, ArrayLike]) -> int:
        return int(np.size(batch["tokens"]))

    def check_batch(self, batch: Mapping[str, ArrayLike], model: RewardModel) -> None:
        super().check_batch({k: v for k, v in batch.items() if k != MARGIN_KEY}, model)
        if MARGIN_KEY not in batch:
            return
        margin = np.asarray(batch[MARGIN_KEY])
        pairs = np.shape(batch["tokens"])[0]
        if margin.shape != (pairs,) or not np.issubdtype(margin.dtype, np.number):
            raise ValueError(
                f"batch[{MARGIN_KEY!r}] must be numbers [batch] = ({pairs},), got "
                f"{margin.dtype} {margin.shape}"
            )
        if not np.all(np.isfinite(margin)):
            raise ValueError(f"batch[{MARGIN_KEY!r}] holds NaN or infinity; margins are numbers")

    def _check_values(self, batch: Mapping[str, np.ndarray], model: RewardModel) -> None:
        tokens, lengths = batch["tokens"], batch["lengths"]
        if tokens.shape[1] != 2 or lengths.shape != tokens.shape[:2]:
            raise ValueError(
                f"batch['tokens'] must be [batch, 2, seq] (chosen, rejected) and "
                f"batch['lengths'] [batch, 2], got {tokens.shape} and {lengths.shape}"
            )
        config = model.config
        longest = model.config.max_tokens if isinstance(model, Classifier) else config.max_positions
        check_ids("tokens", tokens.reshape(-1, tokens.shape[-1]), config.vocab_size, longest)
        if lengths.min() < 1 or lengths.max() > tokens.shape[-1]:
            raise ValueError(
                f"batch['lengths'] must be in [1, {tokens.shape[-1]}] (every row a token at "
                f"least), got [{lengths.min()}, {lengths.max()}]"
            )
