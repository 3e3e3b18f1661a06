"""Compile the train step for every bucket a run will meet, side by side, before its first step.

A bucketed source (`zoo.data.bucketing`) pads each batch to one of a few lengths, and XLA
compiles the train step once per length. Met one at a time, those compiles stop the run again
and again in its first steps (a LoRA fine-tune of SmolLM2-135M on a GPU: about 8 s each, for
steps of a fraction of a second). Before the first step, `compile_ahead` finds the first step
of each length in the run's plan, lowers the step for those batches, and compiles them in a
pool of threads (XLA compiles without holding Python's lock; one thread per 4 cores, so on a
small CPU one after another). Each compiled program lands in JAX's compilation caches, so the
steps that meet those lengths run at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import equinox as eqx
from jaxtyping import PRNGKeyArray, PyTree

from zoo.data.batches import BatchSource
from zoo.train.step import TrainStep

LOOKAHEAD = 4096  # steps of the plan searched for lengths not met yet
# one compile at a time per this many cores: XLA's compiler runs threads of its own, and each
# compile in flight holds its own working memory (two 30-layer compiles at once on a busy 2-core
# CPU saved no time)
CORES_PER_COMPILE = 4


def first_step_of_each_length(source: BatchSource, start: int, end: int) -> list[int]:
    """The first step in `start..end-1` of each padded length of `source`, in step order.

    Empty unless `source` is bucketed (`lengths`, and a `plan(epoch)` of (length, rows) pairs):
    other sources have one shape, or shapes not known before their batches are built."""
    lengths = tuple(getattr(source, "lengths", ()))
    plan = getattr(source, "plan", None)
    per_epoch = len(source)
    if len(lengths) < 2 or plan is None or per_epoch == 0:
        return []
    first: dict[int, int] = {}
    for step in range(start, min(end, start + LOOKAHEAD)):
        epoch, index = divmod(step, per_epoch)
        length = int(plan(epoch)[index][0])
        first.setdefault(length, step)
        if len(first) == len(lengths):
            break
    return sorted(first.values())


def compile_ahead(
    train_step: Callable[..., object],
    model: eqx.Module,
    opt_state: PyTree,
    source: BatchSource,
    key: PRNGKeyArray,
    steps: tuple[int, int],
) -> int:
    """Compile `train_step` for the first batch of each padded length among `steps`
    (start, end), in parallel. Returns how many programs were compiled (0: one length or fewer,
    or a step that is not a `TrainStep`, such as a wrapper of one: nothing done)."""
    found = first_step_of_each_length(source, *steps)
    if len(found) < 2 or not isinstance(train_step, TrainStep):
        return 0

    def lowered(step: int):  # equinox's Lowered
        return train_step.lower(model, opt_state, source.batch(step), key, step)

    workers = max(1, min(len(found), (os.cpu_count() or 1) // CORES_PER_COMPILE))
    if workers == 1:  # one at a time: no lowered program is held while another compiles
        for step in found:
            lowered(step).compile()
        return len(found)
    # tracing and lowering stay on this thread; only XLA's compiles run side by side
    programs = [lowered(step) for step in found]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda program: program.compile(), programs))
    return len(found)
