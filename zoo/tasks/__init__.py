"""Tasks: one per flavor, each turns a batch into a loss and metrics by vmapping the model.

| task | model | batch | loss | metric |
| --- | --- | --- | --- | --- |
| `Classification()` | `Classifier` | `tokens`, `labels` | cross-entropy | accuracy |
| `LanguageModeling()` | `GPT` | `tokens` (+ `loss_mask`) | next-token cross-entropy | perplexity |
| `Translation(label_smoothing)` | `Translator` | `src`, `tgt` | teacher-forced cross-entropy | token accuracy |
| `MaskedLanguageModeling(rate)` | `Classifier(masked_lm=True)` | `tokens` | cross-entropy of the masked tokens | their accuracy |
| `Preference(PreferenceLoss(kind))` | `GPT` | `tokens`, `loss_mask`, `lengths` of (chosen, rejected) pairs | DPO, IPO, hinge, robust, SimPO, ORPO | reward accuracy |
| `RewardModeling()` | `Classifier` (one class), `GPT` with a score head | `tokens`, `lengths` of (chosen, rejected) pairs (+ `margin`) | Bradley-Terry | pair accuracy |
| `GRPO(GRPOLoss(kind))` | `GPT` | completions sampled by the model (`Rollouts`), their advantages | GRPO, DAPO, Dr. GRPO, BNPO, GSPO | mean reward |

Losses and metrics skip padding (the model's `pad_id`) and run in float32.
"""

from __future__ import annotations

from zoo.tasks.base import TASK_FOR_FLAVOR, Stats, Task, token_losses
from zoo.tasks.classification import Classification
from zoo.tasks.grpo import GRPO
from zoo.tasks.grpo_loss import GRPOLoss
from zoo.tasks.grpo_rollouts import PromptRows, Rollouts, RolloutSettings
from zoo.tasks.language_modeling import LanguageModeling
from zoo.tasks.masked_lm import MaskedLanguageModeling, mask_tokens
from zoo.tasks.preference import (
    Preference,
    adapter_values,
    adapters_off,
    answer_logps,
    with_adapter_values,
)
from zoo.tasks.preference_loss import PreferenceLoss
from zoo.tasks.preference_reference import precompute_reference, with_reference
from zoo.tasks.reward import RewardModeling, pair_rewards
from zoo.tasks.translation import Translation


def for_flavor(flavor: str, **options) -> Task:
    """The task that trains `flavor` ("classifier", "gpt" or "translator")."""
    if flavor not in TASK_FOR_FLAVOR:
        raise ValueError(f"unknown flavor {flavor!r}; expected one of {sorted(TASK_FOR_FLAVOR)}")
    return globals()[TASK_FOR_FLAVOR[flavor]](**options)


__all__ = [
    "GRPO",
    "Classification",
    "GRPOLoss",
    "LanguageModeling",
    "MaskedLanguageModeling",
    "Preference",
    "PreferenceLoss",
    "PromptRows",
    "RewardModeling",
    "RolloutSettings",
    "Rollouts",
    "Stats",
    "Task",
    "Translation",
    "adapter_values",
    "adapters_off",
    "answer_logps",
    "for_flavor",
    "mask_tokens",
    "pair_rewards",
    "precompute_reference",
    "token_losses",
    "with_adapter_values",
    "with_reference",
]
