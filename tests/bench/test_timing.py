"""Compile clock and timing loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from zoo.bench.timing import (
    BACKEND_COMPILE_EVENT,
    COMPILE_EVENTS,
    CompileClock,
    Timed,
    interleave,
    time_calls,
)


def test_nested_spans_count_once():
    clock = CompileClock()
    trace, lower = COMPILE_EVENTS[0], COMPILE_EVENTS[1]
    # an outer trace [0, 4] holding a nested trace [1, 2], then lowering [4, 5] and compile [6, 9]
    clock.spans = [(trace, 0.0, 4.0), (trace, 1.0, 2.0), (lower, 4.0, 5.0)]
    clock.spans.append((BACKEND_COMPILE_EVENT, 6.0, 9.0))
    assert clock.total == pytest.approx(8.0)
    assert clock.backend == pytest.approx(3.0)


def test_first_call_compiles_and_later_ones_do_not():
    @jax.jit
    def double(x):
        return x * 2.0

    calls = []

    def call(state):
        calls.append(state)
        return double(state)

    timing, final = time_calls(call, jnp.ones(3), steps=4, warmup=2)
    assert len(calls) == 1 + 2 + 4
    assert len(timing.samples_s) == 4
    assert timing.compile_s > 0.0
    assert timing.median_s > 0.0
    assert float(final[0]) == 2.0**7
    again, _ = time_calls(call, jnp.ones(3), steps=1, warmup=0)
    assert again.compile_s == 0.0


def test_bad_counts_raise():
    with pytest.raises(ValueError, match="steps"):
        time_calls(lambda s: s, None, steps=0, warmup=0)
    with pytest.raises(ValueError, match="warmup"):
        time_calls(lambda s: s, None, steps=1, warmup=-1)


def test_interleave_spreads_calls_over_rounds():
    order = []

    def timer(name):
        timed = Timed(lambda state: order.append(name), wait=lambda _: None)
        timed.start(warmup=0)
        return timed

    first, second = timer("a"), timer("b")
    order.clear()
    interleave([first, second], steps=5, rounds=3)
    # 2 calls per round, the last round tops up to 5 each
    assert order == ["a", "a", "b", "b", "a", "a", "b", "b", "a", "b"]
    assert len(first.samples_s) == len(second.samples_s) == 5


def test_spread_reports_min_max_and_each_rounds_median(monkeypatch):
    # A clock that advances by a scripted duration per call: 1, 2, 3, 10, 5 seconds.
    durations = iter([0.5, 1.0, 2.0, 3.0, 10.0, 5.0])  # the first is the compiling call
    now = [0.0]

    def clock():
        return now[0]

    def call(state):
        now[0] += next(durations)

    monkeypatch.setattr("zoo.bench.timing.time.perf_counter", clock)
    timed = Timed(call, wait=lambda _: None)
    timed.start(warmup=0)
    interleave([timed], steps=5, rounds=3)
    assert timed.rounds_s == [[1.0, 2.0], [3.0, 10.0], [5.0]]
    assert timed.spread() == {"min_s": 1.0, "max_s": 10.0, "round_medians_s": [1.5, 6.5, 5.0]}
    assert timed.median_s == 3.0
    with pytest.raises(ValueError, match="no timed calls"):
        Timed(call).spread()
