"""Tasks: one per flavor, each turns a batch into a loss and metrics by vmapping the model.

| task | model | batch | loss | metric |
| --- | --- | --- | --- | --- |
| `Classification()` | `Classifier` | `tokens`, `labels` | cross-entropy | accuracy |
| `LanguageModeling()` | `GPT` | `tokens` (+ `loss_mask`) | next-token cross-entropy | perplexity |
| `Translation(label_smoothing)` | `Translator` | `src`, `tgt` | teacher-forced cross-entropy | token accuracy |
| `MaskedLanguageModeling(rate)` | `Classifier(masked_lm=True)` | `tokens` | cross-entropy of the masked tokens | their accuracy |

Losses and metrics skip padding (the model's `pad_id`) and run in float32.
"""

from __future__ import annotations

from zoo.tasks.base import TASK_FOR_FLAVOR, Stats, Task, token_losses
from zoo.tasks.classification import Classification
from zoo.tasks.language_modeling import LanguageModeling
from zoo.tasks.masked_lm import MaskedLanguageModeling, mask_tokens
from zoo.tasks.translation import Translation


def for_flavor(flavor: str, **options) -> Task:
    """The task that trains `flavor` ("classifier", "gpt" or "translator")."""
    if flavor not in TASK_FOR_FLAVOR:
        raise ValueError(f"unknown flavor {flavor!r}; expected one of {sorted(TASK_FOR_FLAVOR)}")
    return globals()[TASK_FOR_FLAVOR[flavor]](**options)


__all__ = [
    "Classification",
    "LanguageModeling",
    "MaskedLanguageModeling",
    "Stats",
    "Task",
    "Translation",
    "for_flavor",
    "mask_tokens",
    "token_losses",
]
