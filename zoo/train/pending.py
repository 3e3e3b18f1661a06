"""A checkpoint that finishes in the background: training goes on while its files are written.

On a mesh, orbax copies the arrays to host memory and returns; its own threads write them.
`PendingWrite` runs the rest in a thread of its own: wait for those writes, then publish the
checkpoint (rename its hidden directory into place, drop the oldest). Until then the
checkpoint does not exist for `--resume` nor for `keep`. `wait()` joins the thread and raises
what went wrong there, so a failed write is reported by the next save, at the end of the run,
or on Ctrl-C / SIGTERM, each of which waits for the write in progress first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from zoo.train.spelling import resume_spelling


class CheckpointWriteFailed(OSError):
    """A checkpoint written in the background could not be completed (it was not published)."""


class PendingWrite:
    """`finish()` (which publishes checkpoint `path` and returns its final path) in a thread."""

    def __init__(self, path: Path, finish: Callable[[], Path]):
        self.path = path
        self._finish = finish
        self._result: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"zoo-checkpoint-{path.name}", daemon=False
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._finish()
        except BaseException as error:  # kept for wait(): a thread's exception is otherwise lost
            self._error = error

    @property
    def done(self) -> bool:
        """Whether the write has ended (published, or failed)."""
        return not self._thread.is_alive()

    def wait(self) -> Path:
        """Block until the checkpoint is published; return its path or raise why it was not."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointWriteFailed):
                raise error
            what = getattr(error, "strerror", None) or error
            raise CheckpointWriteFailed(
                f"checkpoint {self.path} could not be written in the background "
                f"({type(error).__name__}: {what}); it was not published, the checkpoints "
                "before it are kept. Fix the cause (disk space, permissions) and continue "
                f"with {resume_spelling()}"
            ) from error
        assert self._result is not None  # set by _run when it raised nothing
        return self._result
