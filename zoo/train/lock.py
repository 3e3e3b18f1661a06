"""One training run per directory: an OS file lock that dies with the process holding it.

Two runs writing the same checkpoints, `metrics.jsonl` and model files would corrupt each
other. `RunLock` takes `fcntl.flock` on `DIRECTORY/.zoo-train.lock` (created if needed) and
writes its pid there; a second run is refused with that pid. The kernel releases the lock
when the process ends, however it ends (even `kill -9`), so a stale lock file is harmless.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".zoo-train.lock"


class RunLock:
    """Context manager: exclusive locks on each of `directories`, or a ValueError naming the pid."""

    def __init__(self, *directories: str | os.PathLike | None):
        unique = {Path(d).resolve() for d in directories if d is not None}
        self.paths = [directory / LOCK_FILE for directory in sorted(unique)]
        self._handles: list[int] = []

    def __enter__(self) -> RunLock:
        try:
            for path in self.paths:
                self._handles.append(_lock(path))
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        for handle in self._handles:
            os.close(handle)  # closing the descriptor drops the flock
        self._handles = []


def _lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(handle)
        raise ValueError(
            f"{path.parent} is in use by another training run (pid {holder}, lock file "
            f"{path}); wait for it to finish or stop it, or train into another directory"
        ) from None
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
    return handle
