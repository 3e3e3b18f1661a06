"""The clipped policy loss of GRPO and its variants, from per-token log-probabilities.

Every formula and default follows TRL's `GRPOTrainer` (TRL 1.16), with its names:

- the importance weight of a completion token is `exp(logp - old_logp)` (`importance_sampling=
  "token"`), or one per completion, `exp(mean over its tokens of logp - old_logp)` (`"sequence"`:
  GSPO);
- the per-token loss is `-min(w * A, clip(w, 1 - epsilon, 1 + epsilon_high) * A)`, plus
  `beta * (exp(ref - logp) - (ref - logp) - 1)` (the k3 estimate of the KL to a reference),
  times the importance weight (`kl_bias_correction`, TRL's `use_bias_correction_kl`);
- the per-token losses of the masked tokens are summed and normalised by `kind`:

| kind | normaliser |
| --- | --- |
| `grpo` | each completion's token count, then the mean over completions |
| `bnpo`, `dapo` | the masked tokens of the batch (TRL's `bnpo` counts one micro-batch, `dapo` the accumulated batch: equal without accumulation) |
| `dr_grpo` | completions x the completion width (`max_completion_length`) |

The loss is returned as a sum and a weight (`zoo.tasks.Stats`), the trainer dividing one by the
other, so the weight never depends on the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

KINDS = ("grpo", "dr_grpo", "dapo", "bnpo")
IMPORTANCE_SAMPLING = ("token", "sequence")


@dataclass(frozen=True, kw_only=True)
class GRPOLoss:
    """The settings of the policy loss (TRL's `GRPOConfig` names and defaults)."""

    kind: str = "dapo"  # grpo | dr_grpo | dapo | bnpo: how the token losses are normalised
    epsilon: float = 0.2  # the ratio is clipped below at 1 - epsilon
    epsilon_high: float | None = None  # ... and above at 1 + epsilon_high (None: epsilon)
    importance_sampling: str = "token"  # token | sequence (GSPO): one ratio per token or per row
    beta: float = 0.0  # weight of the KL to the reference model (0: no reference is read)
    temperature: float = 1.0  # the sampling temperature: logits are divided by it, as sampled
    # the KL term times the importance ratio (TRL's use_bias_correction_kl): an unbiased
    # gradient of the reverse KL, off-policy and on it (the ratio is 1 there, its gradient not)
    kl_bias_correction: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"the GRPO loss kind must be one of {KINDS}, got {self.kind!r}")
        if self.importance_sampling not in IMPORTANCE_SAMPLING:
            raise ValueError(
                f"importance_sampling must be one of {IMPORTANCE_SAMPLING}, got "
                f"{self.importance_sampling!r}"
            )
        if not self.epsilon >= 0 or (self.epsilon_high is not None and not self.epsilon_high >= 0):
            raise ValueError(
                f"epsilon and epsilon_high must be >= 0, got {self.epsilon}, {self.epsilon_high}"
            )
        if not self.beta >= 0:
            raise ValueError(f"beta (the KL weight) must be >= 0, got {self.beta}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def upper(self) -> float:
        """The upper clipping epsilon (`epsilon_high`, else `epsilon`)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def policy_loss(
    loss: GRPOLoss,
    logps: Float[Array, "rows completion"],
    old_logps: Float[Array, "rows completion"],
    advantages: Float[Array, " rows"],
    mask: Float[Array, "rows completion"],
    reference_logps: Float[Array, "rows completion"] | None = None,
) -> dict[str, Float[Array, ""]]:
    """The loss as a sum and its normaliser (`loss_sum`, `weight`), and the clipping and KL
    metrics of these rows with TRL's names (each a value of this call, not a sum)."""
    log_ratio = logps - old_logps
    if loss.importance_sampling == "token":
        log_weights = log_ratio
    else:
        counts = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
        log_weights = jnp.sum(log_ratio * mask, axis=-1, keepdims=True) / counts
    ratio = jnp.exp(log_weights)
    clipped = jnp.clip(ratio, 1.0 - loss.epsilon, 1.0 + loss.upper)
    advantage = advantages[:, None]
    per_token = -jnp.minimum(ratio * advantage, clipped * advantage)
    kl = None
    if loss.beta != 0.0:
        if reference_logps is None:
            raise ValueError("beta > 0 needs the reference model's log-probabilities")
        delta = reference_logps - logps
        kl = jnp.exp(delta) - delta - 1.0
        if loss.kl_bias_correction:
            kl = kl * ratio
        per_token = per_token + loss.beta * kl
    per_token = jnp.broadcast_to(per_token, mask.shape)
    rows = jnp.asarray(mask.shape[0], jnp.float32)
    tokens = jnp.sum(mask)
    masked = per_token * mask
    if loss.kind == "grpo":
        per_row = jnp.sum(masked, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        loss_sum, weight = jnp.sum(per_row), rows
    elif loss.kind == "dr_grpo":
        loss_sum, weight = jnp.sum(masked) / mask.shape[1], rows
    else:  # dapo, bnpo
        loss_sum, weight = jnp.sum(masked), tokens
    out = {"loss_sum": loss_sum, "weight": weight}
    out.update(_clip_metrics(loss, ratio, advantage, mask))
    if kl is not None:
        out["kl"] = jax.lax.stop_gradient(_masked_mean(kl, mask))
    return out


def _masked_mean(values: Array, mask: Array) -> Array:
    """TRL's `global_masked_mean`: over the masked tokens, or over the rows for one value a row."""
    if values.shape[1] == 1:
        return jnp.sum(values) / values.shape[0]
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _row_means(values: Array, mask: Array) -> Array:
    """TRL's `masked_seq_mean`: each row's mean over its tokens (NaN for a row of none)."""
    if values.shape[1] == 1:
        return values[:, 0]
    return jnp.sum(values * mask, axis=-1) / jnp.sum(mask, axis=-1)


def _clip_metrics(loss: GRPOLoss, ratio: Array, advantage: Array, mask: Array) -> dict[str, Array]:
    ratio, advantage = jax.lax.stop_gradient(ratio), jax.lax.stop_gradient(advantage)
    low = ((ratio < 1.0 - loss.epsilon) & (advantage < 0)).astype(jnp.float32)
    high = ((ratio > 1.0 + loss.upper) & (advantage > 0)).astype(jnp.float32)
    region = jnp.maximum(low, high)
    return {
        "clip_ratio/low_mean": _masked_mean(low, mask),
        "clip_ratio/high_mean": _masked_mean(high, mask),
        "clip_ratio/region_mean": _masked_mean(region, mask),
        "clip_ratio/low_min": jnp.nanmin(_row_means(low, mask)),
        "clip_ratio/high_max": jnp.nanmax(_row_means(high, mask)),
    }
