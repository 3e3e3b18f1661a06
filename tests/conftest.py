"""Test-wide settings: strict dtype promotion, no implicit rank promotion, shared-data paths."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ZOO_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"
SHARED_TIKTOKEN = SHARED / "tiktoken"

if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))

needs_shared = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"needs the shared datasets at {SHARED_DATA} (present in CI, absent in a fresh clone)",
)


@pytest.fixture
def key():
    return jax.random.key(0)
