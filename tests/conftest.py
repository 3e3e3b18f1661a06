"""Test-wide settings: strict dtype promotion, no implicit rank promotion, shared-data paths."""

from __future__ import annotations

import os

import jax
import pytest

from tests.data.shared_paths import SHARED_TIKTOKEN

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))


@pytest.fixture
def key():
    return jax.random.key(0)
