"""One training run per directory: an OS file lock that dies with the process holding it.

Two runs writing the same checkpoints, `metrics.jsonl` and model files would corrupt each
other. `RunLock` takes `fcntl.flock` on `DIRECTORY/.zoo-train.lock` (created if needed) and
writes its pid there; a second run is refused with that pid. The kernel releases the lock
when the process ends, however it ends (even `kill -9`), so a stale lock file is harmless.

Within one process the lock is re-entrant for the thread that holds it: `zoo train` takes the
run folder's lock before it checks and records the run, and `Trainer.fit` takes it again. Each
other thread of the process is refused, as another process is.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

LOCK_FILE = ".zoo-train.lock"

# the lock files this process holds: path -> (holding thread, descriptor, times taken)
_held: dict[Path, tuple[int, int, int]] = {}
_held_guard = threading.Lock()


class RunLock:
    """Context manager: exclusive locks on each of `directories`, or a ValueError naming the pid."""

    def __init__(self, *directories: str | os.PathLike | None):
        unique = {Path(d).resolve() for d in directories if d is not None}
        self.paths = [directory / LOCK_FILE for directory in sorted(unique)]
        self._taken: list[Path] = []

    def __enter__(self) -> RunLock:
        try:
            for path in self.paths:
                _take(path)
                self._taken.append(path)
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        for path in reversed(self._taken):
            _give_back(path)
        self._taken = []


def _take(path: Path) -> None:
    thread = threading.get_ident()
    with _held_guard:
        if path in _held:
            holder, handle, times = _held[path]
            if holder != thread:
                raise _in_use(path, str(os.getpid()))
            _held[path] = (holder, handle, times + 1)
            return
        _held[path] = (thread, _lock(path), 1)


def _give_back(path: Path) -> None:
    with _held_guard:
        holder, handle, times = _held.pop(path)
        if times > 1:
            _held[path] = (holder, handle, times - 1)
        else:
            os.close(handle)  # closing the descriptor drops the flock


def _in_use(path: Path, holder: str) -> ValueError:
    return ValueError(
        f"{path.parent} is in use by another training run (pid {holder}, lock file "
        f"{path}); wait for it to finish or stop it, or train into another directory"
    )


def _lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(handle)
        raise _in_use(path, holder) from None
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
    return handle
