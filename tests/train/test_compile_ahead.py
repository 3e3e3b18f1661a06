"""The train step of every bucket compiles before the first step, and the steps that meet a
bucket later run without compiling (`zoo.train.ahead`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zoo
from zoo.data import Ragged
from zoo.data.bucketing import BucketedBatches, DrawnBatches
from zoo.train import LoopSettings, Trainer, adamw
from zoo.train.ahead import compile_ahead, first_step_of_each_length
from zoo.train.optim import init_optimizer

LENGTHS = (8, 16, 32)


def bucketed(kind=BucketedBatches, seed=0):
    """Rows of 3..30 tokens, four of each bucket's lengths, in batches of 2."""
    rng = np.random.default_rng(seed)
    sizes = [5, 6, 7, 8, 12, 13, 15, 16, 20, 25, 30, 31]
    rows = [rng.integers(3, 20, size) for size in sizes]
    return kind(
        {"tokens": Ragged.from_rows(rows)},
        pad_ids={"tokens": 0},
        batch_size=2,
        bucket_lengths=LENGTHS,
        shuffle=False,
    )


def test_the_first_step_of_each_length_is_read_from_the_plan():
    source = bucketed()
    lengths = [length for length, _ in source.plan(0)]
    assert lengths == [8, 8, 16, 16, 32, 32]  # grouped, in order: no shuffle
    assert first_step_of_each_length(source, 0, 6) == [0, 2, 4]
    assert first_step_of_each_length(source, 3, 100) == [3, 4, 6]  # 6 is the next epoch's 8
    assert first_step_of_each_length(source, 0, 3) == [0, 2]  # the run ends before 32
    drawn = bucketed(DrawnBatches, seed=1)
    found = first_step_of_each_length(drawn, 0, 60)
    plan = [length for epoch in range(10) for length, _ in drawn.plan(epoch)]
    assert [plan[step] for step in found] == sorted(set(plan), key=plan.index)
    assert all(plan[step] not in plan[:step] for step in found)


def test_a_source_of_one_shape_compiles_nothing_ahead():
    one = BucketedBatches(
        {"tokens": Ragged.from_rows([[3, 4]] * 4)}, pad_ids={"tokens": 0}, batch_size=2,
        bucket_lengths=(8,),
    )  # fmt: skip
    assert first_step_of_each_length(one, 0, 10) == []


# 2 cores: one compile after another; 16: three side by side in threads
@pytest.mark.parametrize(("precision", "cores"), [("fp32", 2), ("bf16", 16)])
def test_the_steps_of_the_compiled_lengths_do_not_compile_again(precision, cores, monkeypatch):
    monkeypatch.setattr("zoo.train.ahead.os.cpu_count", lambda: cores)
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    trainer = Trainer(
        zoo.tasks.LanguageModeling(), adamw(1e-3), precision=precision,
        loop=LoopSettings(progress=False),
    )  # fmt: skip
    source, key = bucketed(), jax.random.key(1)
    opt_state = init_optimizer(trainer.optimizer, model)
    assert compile_ahead(trainer.train_step, model, opt_state, source, key, (0, 6)) == 3
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for step in (0, 2, 4):
            model, opt_state, output = trainer.train_step(
                model, opt_state, source.batch(step), key, step
            )
            assert np.isfinite(float(output.stats.loss))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert [name for name in compiles if "train_step" in str(name)] == []
