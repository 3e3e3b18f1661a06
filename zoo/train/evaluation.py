"""Evaluation for the trainer: a task's summed statistics over eval batches, as host numbers.

`Trainer.evaluate` and each evaluation of a run (`zoo.train.loop`) go through `evaluate`; the
rows of `metrics.jsonl` take their loss and metric from `summarise`.
"""

from __future__ import annotations

from typing import TypedDict

import equinox as eqx
import jax

from zoo.data.batches import BatchSource
from zoo.progress import Progress
from zoo.tasks.base import Stats, Task
from zoo.train.step import EvalStep


class Summary(TypedDict):
    """Summed statistics as host numbers: the loss and the task's metric, by name."""

    loss: float
    metric: float
    metric_name: str
    scored: int  # positions scored (`Stats.weight`): a language model's trained tokens
    metrics: dict[str, float]  # the task's further metrics by name (`Task.metrics`; often none)


class Evaluation(Summary):
    """A `Summary` over eval batches, with the tokens they held."""

    tokens: int


def summarise(task: Task, stats: Stats) -> Summary:
    """Host floats of summed statistics: loss, the task's metric and its name."""
    stats = jax.device_get(stats)
    return {
        "loss": float(stats.loss),
        "metric": float(task.metric(stats)),
        "metric_name": task.metric_name,
        "scored": round(float(stats.weight)),
        "metrics": {name: float(value) for name, value in task.metrics(stats).items()},
    }


def evaluate(
    task: Task,
    eval_step: EvalStep,
    model: eqx.Module,
    batches: BatchSource,
    *,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Evaluation:
    """Loss, metric and token count over `batches` (the first `limit`), without dropout;
    `progress` advances by one per batch."""
    task.check_model(model)
    count = len(batches)
    if count == 0:
        raise ValueError("eval_batches is empty: it yields no batches (len 0)")
    count = count if limit is None else min(count, limit)
    total, tokens = Stats.zero(), 0
    for index in range(count):
        batch = batches.batch(index)
        task.check_batch(batch, model)
        total = total + eval_step(model, batch)
        tokens += task.num_tokens(batch)
        if progress is not None:  # counts the batches computed, not those only queued
            jax.block_until_ready(total)
            progress.advance()
    return {**summarise(task, total), "tokens": tokens}
