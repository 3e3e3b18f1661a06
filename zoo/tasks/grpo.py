"""Reinforcement learning from rewards of a `zoo.GPT`: GRPO and its variants (DAPO, Dr. GRPO,
BNPO, GSPO), with the loss of `zoo.tasks.GRPOLoss`.

A batch holds completions the model sampled for prompts, scored already
(`zoo.tasks.grpo_rollouts.Rollouts` samples and scores them with the model being trained):

| key | shape | what |
| --- | --- | --- |
| `tokens` | `int32[rows, prompt + completion]` | each row's prompt, its completion, then filler |
| `prompt_lengths` | `int32[rows]` | the prompt's tokens in each row |
| `completion_mask` | `int32[rows, completion]` | 1 on the completion tokens the loss counts |
| `token_counts` | `int32[rows]` | the real tokens of each row (prompt and whole completion) |
| `advantages` | `float32[rows]` | each completion's advantage |
| `old_logps` | `float32[rows, completion]` | optional: the sampling model's log-probabilities (μ > 1) |
| `reference_logps` | `float32[rows, completion]` | with `beta > 0`: the reference model's |
| `rollout/NAME` | `float32[rows]` | optional: metric NAME of the rollout, a share per row |

Without `old_logps` the ratio is 1 (the completions come from the model itself, as TRL's
`old_per_token_logps = per_token_logps.detach()`). Metrics (TRL's names): `kl`, `entropy`,
`clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean`, `clip_ratio/low_min`,
`clip_ratio/high_max`, each averaged over the forward passes logged (as TRL averages them over
micro-batches and steps), and the rollout's own (`reward`, `reward_std`, `rewards/NAME/mean`,
`completions/mean_length`, ...), averaged over the steps logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from zoo.nn.moe import RouterStats
from zoo.tasks.base import LanguageModel, Stats, Task, check_ids, example_keys
from zoo.tasks.grpo_loss import GRPOLoss, policy_loss
from zoo.tasks.router_losses import with_router_losses

FLOAT_KEYS = ("advantages", "old_logps", "reference_logps")
ROLLOUT_PREFIX = "rollout/"  # batch keys of the rollout's metrics, a share of the value per row
CALLS = "_calls"  # forward passes summed into one `Stats` (each adds 1)
ROLLOUTS = ROLLOUT_PREFIX + "_steps"  # rollout steps summed (each step's rows add up to 1)


def completion_logps(
    model: LanguageModel,
    batch: Mapping[str, ArrayLike],
    temperature: float,
    *,
    key: PRNGKeyArray | None = None,
) -> tuple[Float[Array, "rows completion"], Float[Array, "rows completion"], RouterStats | None]:
    """`(log-probabilities, entropies, router statistics)` of each completion token, from the
    logits divided by `temperature` (as they were sampled), in float32."""
    tokens = jnp.asarray(batch["tokens"])
    prompt_lengths = jnp.asarray(batch["prompt_lengths"])
    width = jnp.shape(batch["completion_mask"])[1]
    real = jnp.arange(tokens.shape[1])[None, :] < jnp.asarray(batch["token_counts"])[:, None]
    keys = example_keys(key, tokens.shape[0])
    head = model.output_head

    def one(tokens, real, prompt_length, key):
        features, router = model.features_and_router(tokens, real, key=key)
        # completion token j is predicted at position prompt_length - 1 + j
        positions = jnp.minimum(prompt_length - 1 + jnp.arange(width), tokens.shape[0] - 1)
        targets = tokens[jnp.minimum(positions + 1, tokens.shape[0] - 1)]
        logits = head(features[positions]).astype(jnp.float32)[:, : head.vocab_size]
        logits = logits / temperature
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
        return picked, entropy, router

    return jax.vmap(one)(tokens, real, prompt_lengths, keys)


class GRPO(Task[LanguageModel]):
    """Train a `zoo.GPT` on scored completions with a `GRPOLoss` (see the module doc).

    ```python
    task = zoo.tasks.GRPO(zoo.tasks.GRPOLoss(kind="dapo"))
    rollouts = zoo.tasks.Rollouts(prompts, task, rewards=[my_reward], ...)
    model, history = zoo.Trainer(task, zoo.train.adamw(lr=1e-6)).fit(model, rollouts, ...)
    ```

    Args:
        loss: the loss and its settings (default: TRL's, `dapo` with epsilon 0.2).
    """

    flavor = "gpt"
    metric_name = "reward"
    lower_is_better = False
    required: ClassVar[dict[str, str]] = {
        "tokens": "[rows, seq]",
        "prompt_lengths": "[rows]",
        "completion_mask": "[rows, completion]",
        "token_counts": "[rows]",
    }

    def __init__(self, loss: GRPOLoss | None = None):
        if loss is not None and not isinstance(loss, GRPOLoss):
            raise TypeError(f"loss must be a zoo.tasks.GRPOLoss, got {type(loss).__name__}")
        self.loss = loss or GRPOLoss()

    def statistics(
        self,
        model: LanguageModel,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        loss = self.loss
        logps, entropy, router = completion_logps(model, batch, loss.temperature, key=key)
        mask = jnp.asarray(batch["completion_mask"]).astype(jnp.float32)
        if "old_logps" in batch:
            old = jnp.asarray(batch["old_logps"], jnp.float32)
        else:
            old = jax.lax.stop_gradient(logps)
        reference = batch.get("reference_logps")
        if reference is not None:
            reference = jnp.asarray(reference, jnp.float32)
        advantages = jnp.asarray(batch["advantages"], jnp.float32)
        terms = policy_loss(loss, logps, old, advantages, mask, reference)
        entropy_mean = jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        extra = {name: value for name, value in terms.items() if name not in ("loss_sum", "weight")}
        extra["entropy"] = jax.lax.stop_gradient(entropy_mean)
        extra[CALLS] = jnp.ones((), jnp.float32)
        for name, value in batch.items():
            if name.startswith(ROLLOUT_PREFIX):
                extra[name] = jnp.sum(jnp.asarray(value, jnp.float32))
        stats = Stats(
            loss_sum=terms["loss_sum"],
            nll_sum=jax.lax.stop_gradient(-jnp.sum(logps * mask)),
            weight=terms["weight"],
            correct=jnp.zeros((), jnp.float32),
            extra=extra,
        )
        return with_router_losses(stats, router, model)

    def metric(self, stats: Stats) -> Float[Array, ""]:
        steps = stats.extra.get(ROLLOUTS)
        total = stats.extra.get(ROLLOUT_PREFIX + "reward")
        if steps is None or total is None:
            return jnp.full((), jnp.nan, jnp.float32)
        return total / jnp.maximum(steps, 1e-9)

    def metrics(self, stats: Stats) -> dict[str, Float[Array, ""]]:
        extra = stats.extra
        calls = jnp.maximum(extra.get(CALLS, jnp.ones((), jnp.float32)), 1.0)
        steps = jnp.maximum(extra.get(ROLLOUTS, jnp.ones((), jnp.float32)), 1e-9)
        out = {}
        for name, total in extra.items():
            if name in (CALLS, ROLLOUTS):
                continue
            if name.startswith(ROLLOUT_PREFIX):
                out[name.removeprefix(ROLLOUT_PREFIX)] = total / steps
            elif name.startswith("router_") or name == "expert_load":
                out[name] = total / jnp.maximum(stats.weight, 1.0)
            else:
                out[name] = total / calls
        return out

    def num_tokens(self, batch: Mapping[str, ArrayLike]) -> int:
        return int(np.sum(batch["token_counts"]))

    def check_batch(self, batch: Mapping[str, ArrayLike], model: LanguageModel) -> None:
        floats = {name for name in batch if name in FLOAT_KEYS or name.startswith(ROLLOUT_PREFIX)}
        super().check_batch({k: v for k, v in batch.items() if k not in floats}, model)
        rows, width = np.shape(batch["completion_mask"])
        if "advantages" not in batch:
            raise ValueError("a GRPO batch needs 'advantages' (float32 [rows])")
        for name in floats:
            value = np.asarray(batch[name])
            shape = (rows, width) if name.endswith("logps") else (rows,)
            if value.shape != shape or not np.issubdtype(value.dtype, np.floating):
                raise ValueError(f"batch[{name!r}] must be float {list(shape)}, got {value.dtype} "
                                 f"{list(value.shape)}")  # fmt: skip
        if self.loss.beta != 0.0 and "reference_logps" not in batch:
            raise ValueError(
                f"beta={self.loss.beta} weighs the KL to a reference model, and the batch has no "
                "'reference_logps': give the rollouts a reference (or set beta=0)"
            )

    def _check_values(self, batch: Mapping[str, np.ndarray], model: LanguageModel) -> None:
        config = model.config
        tokens, mask = batch["tokens"], batch["completion_mask"]
        check_ids("tokens", tokens, config.vocab_size, config.max_positions)
        prompt_lengths, counts = batch["prompt_lengths"], batch["token_counts"]
        if prompt_lengths.min() < 1 or (prompt_lengths + mask.shape[1]).max() > tokens.shape[1]:
            raise ValueError(
                f"batch['prompt_lengths'] must be in [1, {tokens.shape[1] - mask.shape[1]}] (a "
                f"prompt token at least, and room for the completion), got "
                f"[{prompt_lengths.min()}, {prompt_lengths.max()}]"
            )
        if (counts < prompt_lengths).any() or (counts > prompt_lengths + mask.shape[1]).any():
            raise ValueError("batch['token_counts'] must lie between each row's prompt length "
                             "and its prompt length plus the completion width")  # fmt: skip
