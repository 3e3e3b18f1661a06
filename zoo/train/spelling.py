"""How a message tells its reader to continue a run: `resume=True` to a Python caller of
`Trainer.fit`, `--resume` to a user of `zoo train`, which says so for the time of its run
(`spoken_as`). The messages come from the loop, the checkpoint writers (some in a background
thread) and the folder checks, so the spelling is one module value, not an argument."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

PYTHON_RESUME = "resume=True"  # what `Trainer.fit` takes
_spelling = {"resume": PYTHON_RESUME}


def resume_spelling() -> str:
    """The words that continue a run, in the reader's language (`resume=True`, `--resume`)."""
    return _spelling["resume"]


@contextmanager
def spoken_as(resume: str) -> Iterator[None]:
    """Within the block, messages say `resume` (e.g. `"--resume"`) to continue a run."""
    before, _spelling["resume"] = _spelling["resume"], resume
    try:
        yield
    finally:
        _spelling["resume"] = before
