"""Where the shared datasets and tiktoken files are, for the data tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _shared() -> Path:
    """`$ZOO_SHARED`, else the nearest `shared/` folder beside the repository or an ancestor."""
    if "ZOO_SHARED" in os.environ:
        return Path(os.environ["ZOO_SHARED"])
    repo = Path(__file__).resolve().parents[2]
    for folder in repo.parents:
        if (folder / "shared" / "data").is_dir():
            return folder / "shared"
    return repo.parent / "shared"


SHARED = _shared()
SHARED_DATA = SHARED / "data"
SHARED_TIKTOKEN = SHARED / "tiktoken"

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"needs the shared datasets at {SHARED_DATA} (present in CI, absent in a fresh clone)",
)
