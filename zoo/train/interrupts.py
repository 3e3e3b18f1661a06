"""Ctrl-C and SIGTERM during training are held until the model and optimizer state are whole.

The jitted step donates the model and optimizer state: while it runs, the old buffers are gone
and the new ones do not exist yet, so an interrupt raised in the middle would leave nothing to
save. A checkpoint write cut short would leave nothing either. `HeldInterrupts` turns SIGINT
(Ctrl-C) and SIGTERM (what schedulers and spot instances send before they stop a job) into a
flag; the loop calls `check()` where the state is whole, which raises `KeyboardInterrupt` or
`Terminated`, and the loop saves a checkpoint before passing it on. Inside `immediate()`
(evaluation: nothing is donated or written) a signal raises at once. A second signal always
raises at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run saves a checkpoint, then stops (exit status 143)."""

    exit_status = 128 + signal.SIGTERM


def ignore_further_interrupts() -> None:
    """Ignore SIGINT and SIGTERM from now on: the run is saved and the process is on its way out.

    A Ctrl-C pressed twice lands its second signal while the process exits, in the lock's
    release or in JAX's exit handlers, which print its traceback; ignored, the exit is quiet."""
    if threading.current_thread() is threading.main_thread():
        for signum in HELD_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The exception a held signal becomes: `Terminated` for SIGTERM, else KeyboardInterrupt."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


# a signal's handler as `signal.signal` returns it (a function, SIG_DFL / SIG_IGN, or None)
Handler = Callable[[int, FrameType | None], object] | int | None


class HeldInterrupts:
    """Context manager: SIGINT/SIGTERM set `received`; `check()` raises the interrupt then."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._immediate = False
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> HeldInterrupts:
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            for signum in HELD_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if not first or self._immediate:
            raise interrupt_for(signum)

    def check(self) -> None:
        """Raise the held interrupt, now that the model and optimizer state are whole again."""
        if self.received is not None:
            raise interrupt_for(self.received)

    @contextmanager
    def immediate(self) -> Iterator[None]:
        """A stretch where the state stays whole, so a signal may stop it at once."""
        self.check()
        self._immediate = True
        try:
            yield
        finally:
            self._immediate = False

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            # None: the previous handler was not installed from Python; the default stands in.
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
