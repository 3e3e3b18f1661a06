"""How zoo times things: warm-up, `block_until_ready`, median; compile time from JAX's events."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling inside a `with` block.

    `total` is trace + lower + XLA compile (the union of their time spans); `backend` is the
    XLA compile alone. Used around the first call of a jitted function, which is where JAX
    compiles it; this works for functions we do not own (the trainer's step) too.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def _listen(self, event: str, start: float, end: float, **_: Any) -> None:
        if event in COMPILE_EVENTS:
            self.spans.append((event, start, end))

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
        return sum(
            end - start for event, start, end in self.spans if event == BACKEND_COMPILE_EVENT
        )


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated calls: the first (compiling) call and the timed ones."""

    first_s: float  # the first call, compile included
    compile_s: float  # trace + lower + compile inside the first call (0.0 where nothing compiles)
    samples_s: tuple[float, ...]  # each timed call, after the warm-up

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)


def time_calls(
    call: Callable[[Any], Any],
    state: Any,
    *,
    steps: int,
    warmup: int,
    wait: Callable[[Any], Any] = jax.block_until_ready,
) -> tuple[Timing, Any]:
    """Call `state = call(state)` 1 + warmup + steps times; time each call until `wait` returns.

    The first call is timed with a `CompileClock`, the next `warmup` calls are not recorded and
    the median of the last `steps` is the result. `wait` blocks until the device is done
    (`jax.block_until_ready`, or `torch.cuda.synchronize` for the peer). Returns the timing and
    the final state.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 timed calls, got {steps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    start = time.perf_counter()
    with CompileClock() as clock:
        state = call(state)
        wait(state)
    first = time.perf_counter() - start
    for _ in range(warmup):
        state = call(state)
        wait(state)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        state = call(state)
        wait(state)
        samples.append(time.perf_counter() - start)
    return Timing(first, clock.total, tuple(samples)), state
