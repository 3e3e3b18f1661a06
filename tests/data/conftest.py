"""Data tests run offline, quietly, with `datasets` caches in temporary folders."""

from __future__ import annotations

import os

import pytest

from .shared_paths import SHARED_TIKTOKEN

# Before `datasets` is imported: never reach for the hub, never draw progress bars.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    """Point the default `datasets` cache at this session's temporary folder."""
    import datasets

    cache = tmp_path_factory.getbasetemp() / "hf_datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    datasets.disable_progress_bars()
    return cache


@pytest.fixture(scope="session")
def gpt2():
    """The gpt2 tiktoken tokenizer, or a skip when its files cannot be had offline."""
    from zoo.data import TiktokenTokenizer

    try:
        return TiktokenTokenizer("gpt2")
    except RuntimeError as error:
        pytest.skip(f"tiktoken gpt2 encoding not available offline: {error}")
