"""`PreferenceLoss`: what a pair of answers (chosen, rejected) costs, for DPO and its relatives.

Every loss reads the log-probabilities of the two answers under the policy (and, for the DPO
family, under the reference model), summed over each answer's tokens (`logps`, `[pairs]`):

| kind | per pair | reference |
| --- | --- | --- |
| `sigmoid` (DPO) | `-log σ(β Δ)` | yes |
| `ipo` | `(Δ / tokens - 1 / 2β)²`, each side's log-ratio averaged over its tokens | yes |
| `hinge` | `max(0, 1 - β Δ)` | yes |
| `robust` | `((1-ε)(-log σ(β Δ)) - ε(-log σ(-β Δ))) / (1 - 2ε)` | yes |
| `simpo` | `-log σ(β (avg_c - avg_r) - γ)`, averages over each answer's tokens | no |
| `orpo` | `nll(chosen) - β log σ(log odds(avg_c) - log odds(avg_r))` | no |

where `Δ = (logp_c - ref_c) - (logp_r - ref_r)`. The formulas and the logged rewards are TRL's
(`DPOTrainer`, `CPOTrainer(loss_type="simpo")`, `ORPOTrainer`; ORPO's `β` is the paper's `λ`).
Rewards: `β (logp - ref)` for the DPO family, `β avg_logp` for SimPO and ORPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

KINDS = ("sigmoid", "ipo", "hinge", "robust", "simpo", "orpo")
REFERENCE_FREE = ("simpo", "orpo")  # kinds that read no reference model
# zoo train's --objective -> the loss kind
OBJECTIVES = {
    "dpo": "sigmoid",
    "ipo": "ipo",
    "hinge": "hinge",
    "robust": "robust",
    "simpo": "simpo",
    "orpo": "orpo",
}


@dataclass(frozen=True, kw_only=True)
class PreferenceLoss:
    """One preference loss and its settings (see the module doc for the formulas)."""

    kind: str = "sigmoid"  # sigmoid (DPO), ipo, hinge, robust, simpo or orpo
    beta: float = 0.1  # β: DPO's KL weight, IPO's τ, SimPO's scale, ORPO's λ
    label_smoothing: float = 0.0  # robust: ε, the share of pairs assumed flipped (< 0.5)
    gamma: float = 0.5  # simpo: γ, the reward margin the chosen answer must win by

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"PreferenceLoss kind must be one of {KINDS}, got {self.kind!r}")
        if not self.beta > 0:
            raise ValueError(f"PreferenceLoss beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(
                f"PreferenceLoss label_smoothing must be in [0, 0.5), got {self.label_smoothing}"
            )
        if self.label_smoothing and self.kind != "robust":
            raise ValueError(
                f"label_smoothing is the robust loss's ε; kind {self.kind!r} has none: "
                "use kind='robust' or label_smoothing=0"
            )

    @property
    def needs_reference(self) -> bool:
        """Whether the loss compares with a reference model (the DPO family)."""
        return self.kind not in REFERENCE_FREE

    @property
    def averaged(self) -> bool:
        """Whether the policy's log-probabilities are averaged over the answer (SimPO, ORPO)."""
        return self.kind in REFERENCE_FREE


def _log1mexp(values: Float[Array, " pairs"]) -> Float[Array, " pairs"]:
    """`log(1 - exp(x))` for `x < 0`, accurate on both sides of `-log 2`."""
    return jnp.where(
        values > -0.6931471805599453,
        jnp.log(-jnp.expm1(values)),
        jnp.log1p(-jnp.exp(values)),
    )


def pair_losses(
    loss: PreferenceLoss,
    logps: Float[Array, "pairs 2"],
    reference: Float[Array, "pairs 2"] | None,
    answer_tokens: Float[Array, "pairs 2"],
) -> dict[str, Float[Array, " pairs"]]:
    """Per-pair loss, rewards and (ORPO) odds terms.

    Args:
        loss: the loss and its settings.
        logps: the policy's log-probability of each answer (chosen, rejected), summed over its
            tokens.
        reference: the reference model's, the same way (None for SimPO and ORPO).
        answer_tokens: how many tokens each answer has.
    """
    counts = jnp.maximum(answer_tokens, 1.0)
    beta = loss.beta
    if loss.averaged:
        average = logps / counts
        chosen, rejected = average[:, 0], average[:, 1]
        terms = {"chosen_rewards": beta * chosen, "rejected_rewards": beta * rejected}
        if loss.kind == "simpo":
            logits = chosen - rejected - loss.gamma / beta
            terms["loss"] = -jax.nn.log_sigmoid(beta * logits)
        else:
            log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
            ratio = jax.nn.log_sigmoid(log_odds)
            terms |= {"loss": -beta * ratio, "log_odds_ratio": ratio, "log_odds_chosen": log_odds}
        return terms
    if reference is None:
        raise ValueError(
            f"the {loss.kind!r} loss compares with a reference model: give the batch "
            "'reference_logps' (zoo.tasks.with_reference) or use Preference(reference='adapters')"
        )
    ratios = logps - reference
    delta = ratios[:, 0] - ratios[:, 1]
    if loss.kind == "sigmoid":
        per_pair = -jax.nn.log_sigmoid(beta * delta)
    elif loss.kind == "hinge":
        per_pair = jax.nn.relu(1.0 - beta * delta)
    elif loss.kind == "ipo":
        averaged = ratios / counts
        per_pair = (averaged[:, 0] - averaged[:, 1] - 1.0 / (2.0 * beta)) ** 2
    else:  # robust
        eps = loss.label_smoothing
        clean = -(1.0 - eps) * jax.nn.log_sigmoid(beta * delta)
        flipped = -eps * jax.nn.log_sigmoid(-beta * delta)
        per_pair = (clean - flipped) / (1.0 - 2.0 * eps)
    return {
        "loss": per_pair,
        "chosen_rewards": beta * jax.lax.stop_gradient(ratios[:, 0]),
        "rejected_rewards": beta * jax.lax.stop_gradient(ratios[:, 1]),
    }
