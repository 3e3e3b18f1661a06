"""A stand-in for the HuggingFace hub: a local folder plays the repository, nothing is fetched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def stub_hub(monkeypatch, repo: Path, cache: Path) -> list[str]:
    """Serve `repo` as every hub repository; returns the list the downloaded file names land in.

    `list_repo_files` lists `repo`; `snapshot_download` copies the files its `allow_patterns`
    select (with huggingface_hub's own pattern matching) into `cache`, as the hub client does.
    """
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import filter_repo_objects

    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    downloaded: list[str] = []

    def list_repo_files(repo_id, *, revision=None, **kwargs):
        return list(files)

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, **kwargs):
        for name in filter_repo_objects(files, allow_patterns=allow_patterns):
            (cache / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / name, cache / name)
            downloaded.append(name)
        return str(cache)

    monkeypatch.setattr(huggingface_hub, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return downloaded
