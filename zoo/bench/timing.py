"""How zoo times things: warm-up, `block_until_ready`, interleaved rounds, median; compile time
from JAX's events."""

from __future__ import annotations

import abc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypedDict, TypeVar

import jax
import jax.monitoring

# The events JAX records while it turns a Python function into an executable: tracing to a
# jaxpr, lowering to MLIR, and the XLA compile. Nested jits record nested spans, so the clock
# adds up the union of the spans rather than their sum.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
BACKEND_COMPILE_EVENT = COMPILE_EVENTS[-1]
State = TypeVar("State")  # what a timed call hands to the next one (None before the first)


class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling inside a `with` block.

    `total` is trace + lower + XLA compile (the union of their time spans); `backend` is the
    XLA compile alone. Used around the first call of a jitted function, which is where JAX
    compiles it; this works for functions we do not own (the trainer's step) too.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def _listen(self, event: str, start_time: float, end_time: float, **_: str | int) -> None:
        if event in COMPILE_EVENTS:
            self.spans.append((event, start_time, end_time))

    def __enter__(self) -> CompileClock:
        jax.monitoring.register_event_time_span_listener(self._listen)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_time_span_listener(self._listen)

    @property
    def total(self) -> float:
        covered, reach = 0.0, float("-inf")
        for _, start, end in sorted(self.spans, key=lambda span: span[1]):
            if end <= reach:
                continue
            covered += end - max(start, reach)
            reach = end
        return covered

    @property
    def backend(self) -> float:
        spans = [end - start for event, start, end in self.spans if event == BACKEND_COMPILE_EVENT]
        return float(sum(spans))


class Spread(TypedDict):
    """How the timed calls of a `Timed` spread, in seconds."""

    min_s: float
    max_s: float
    round_medians_s: list[float]  # the median of each round (`sample` call)


class Timer(abc.ABC):
    """The timings of a call made again and again (a `Timed`, whatever its state).

    `start` makes the first (compiling) call under a `CompileClock` and the untimed warm-up
    calls; `sample` adds timed calls.
    """

    def __init__(self) -> None:
        self.first_s: float | None = None  # the first call, compile included
        self.compile_s = 0.0  # trace + lower + compile inside the first call (JAX only)
        self.backend_compile_s = 0.0  # the XLA compile alone
        self.samples_s: list[float] = []  # every timed call
        self.rounds_s: list[list[float]] = []  # the timed calls of each `sample` call (a round)

    @abc.abstractmethod
    def _run(self) -> float:
        """One call, waited for: its seconds."""

    def start(self, warmup: int) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        with CompileClock() as clock:
            self.first_s = self._run()
        self.compile_s = clock.total
        self.backend_compile_s = clock.backend
        for _ in range(warmup):
            self._run()

    def sample(self, count: int) -> None:
        times = [self._run() for _ in range(count)]
        self.samples_s += times
        if times:
            self.rounds_s.append(times)

    @property
    def median_s(self) -> float:
        if not self.samples_s:
            raise ValueError("no timed calls yet: call sample() after start()")
        return statistics.median(self.samples_s)

    def spread(self) -> Spread:
        """min, max and the median of each round of the timed calls, in seconds."""
        self.median_s  # noqa: B018 (raises when nothing was timed)
        return {
            "min_s": min(self.samples_s),
            "max_s": max(self.samples_s),
            "round_medians_s": [statistics.median(times) for times in self.rounds_s],
        }


class Timed(Timer, Generic[State]):
    """A call to time again and again: `state = call(state)`, done when `wait(state)` returns.

    `wait` blocks until the device is done: `jax.block_until_ready`, or
    `torch.cuda.synchronize` for the peer. A call without a state of its own is handed None
    first, then what it returned.
    """

    def __init__(
        self,
        call: Callable[[State | None], State],
        state: State | None = None,
        *,
        wait: Callable[[State], object] = jax.block_until_ready,
    ):
        super().__init__()
        self.call = call
        self.state = state
        self.wait = wait

    def _run(self) -> float:
        start = time.perf_counter()
        state = self.call(self.state)
        self.state = state
        self.wait(state)
        return time.perf_counter() - start


def interleave(timers: Sequence[Timer], *, steps: int, rounds: int) -> None:
    """Give every timer `steps` timed calls, spread over `rounds` rounds that visit each in turn.

    On a shared machine the load changes from one second to the next; interleaving lets the
    zoo and its peer (and train, forward and decode) see the same load, so their ratio holds
    even when the absolute numbers wander.
    """
    if steps < 1 or rounds < 1:
        raise ValueError(f"steps and rounds must be >= 1, got steps={steps}, rounds={rounds}")
    per_round = math.ceil(steps / rounds)
    for _ in range(rounds):
        for timer in timers:
            timer.sample(min(per_round, steps - len(timer.samples_s)))


def time_calls(
    call: Callable[[State | None], State],
    state: State | None,
    *,
    steps: int,
    warmup: int,
    wait: Callable[[State], object] = jax.block_until_ready,
) -> tuple[Timed[State], State | None]:
    """Time one call on its own: first call, `warmup` untimed calls, `steps` timed calls.

    Returns the `Timed` (median in `median_s`, compile in `compile_s`) and the final state.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 timed calls, got {steps}")
    timer = Timed(call, state, wait=wait)
    timer.start(warmup)
    timer.sample(steps)
    return timer, timer.state
