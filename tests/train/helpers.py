"""Shared by the training tests: small language-modelling batches, parameter dumps, trainers."""

from __future__ import annotations

import numpy as np

from zoo.data.batches import ArrayBatches
from zoo.serialize import named_arrays
from zoo.train import LoopSettings, Trainer


def lm_batches(num=64, length=12, seed=0, batch_size=8) -> ArrayBatches:
    """Random tokens 3..19 with padded tails of random length."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 20, (num, length)).astype(np.int32)
    lengths = rng.integers(length // 2, length + 1, num)
    tokens[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return ArrayBatches({"tokens": tokens}, batch_size, seed=seed)


def params(model):
    return {name: np.asarray(a) for name, a in named_arrays(model).items()}


def sharing(trainer, **loop):
    """A trainer with other loop settings (`LoopSettings`): it reuses `trainer`'s compiled step."""
    other = Trainer(trainer.task, trainer.optimizer, loop=LoopSettings(progress=False, **loop))
    assert other.train_step is trainer.train_step
    return other
