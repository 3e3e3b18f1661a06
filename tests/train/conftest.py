"""Fixtures of the training tests: a tiny GPT and a trainer that logs every step."""

from __future__ import annotations

import jax
import pytest

import zoo
from zoo.train import LoopSettings, Trainer, adamw


@pytest.fixture(scope="module")
def tiny_gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(0))


@pytest.fixture(scope="module")
def lm_trainer():
    """Logs every step, checkpoints every 2."""
    loop = LoopSettings(log_every=1, checkpoint_every=2, progress=False)
    return Trainer(zoo.tasks.LanguageModeling(), adamw(3e-3, warmup=3), loop=loop)
