"""Ctrl-C during a training step is held until the step returns.

The jitted step donates the model and optimizer state: while it runs, the old buffers are gone
and the new ones do not exist yet, so an interrupt raised in the middle would leave nothing to
save. `StepBoundaryInterrupts` turns SIGINT into a flag that the loop checks after each step;
a second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class StepBoundaryInterrupts:
    """Context manager: SIGINT sets `requested`; `check()` raises KeyboardInterrupt then."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StepBoundaryInterrupts:
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def check(self) -> None:
        """Raise the held interrupt, now that the model and optimizer state are whole again."""
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
