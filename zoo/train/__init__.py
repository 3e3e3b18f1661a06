"""Training: the shared `Trainer`, optimisers and schedules, checkpoints.

```python
trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(lr=3e-4, warmup=200),
                      loop=zoo.train.LoopSettings(eval_every=500))
model, history = trainer.fit(model, train_batches, eval_batches=val_batches, steps=2000,
                             key=jax.random.key(0), outputs=zoo.train.Outputs("runs/gpt"))
```
"""

from __future__ import annotations

from zoo.train.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from zoo.train.history import History
from zoo.train.interrupts import Terminated
from zoo.train.loop import TrainingDiverged
from zoo.train.optim import (
    SCHEDULES,
    Optimizer,
    adamw,
    constant,
    cosine,
    decay_mask,
    inverse_sqrt,
    make_schedule,
    paper_peak_lr,
)
from zoo.train.settings import LoopSettings, Outputs
from zoo.train.step import PRECISIONS, cast_floating
from zoo.train.trainer import Trainer

__all__ = [
    "PRECISIONS",
    "SCHEDULES",
    "Checkpoint",
    "History",
    "LoopSettings",
    "Optimizer",
    "Outputs",
    "Terminated",
    "Trainer",
    "TrainingDiverged",
    "adamw",
    "cast_floating",
    "constant",
    "cosine",
    "decay_mask",
    "inverse_sqrt",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "make_schedule",
    "paper_peak_lr",
    "save_checkpoint",
]
