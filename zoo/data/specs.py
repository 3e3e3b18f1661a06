"""Data specs: one string names a dataset, `load_spec(spec)` loads it as a `DatasetDict`.

| spec | loads |
| --- | --- |
| `hf:NAME[:CONFIG]` | `datasets.load_dataset(NAME, CONFIG)`: a hub dataset, or a local folder in the hub's layout; a folder written by `save_to_disk` is read with `load_from_disk` |
| `json:DIR` | `DIR/train.jsonl` (or .json), `validation.*`, `test.*` |
| `csv:DIR` | `DIR/train.csv`, `validation.csv`, `test.csv` |
| `parquet:DIR` | `DIR/train.parquet`, `validation.parquet`, `test.parquet` |
| `text:FILE_OR_DIR` | one text file as the train split, or `DIR/train.txt`, `validation.txt`, ... (without those: every `*.txt` in DIR is train) |

`json:`, `csv:`, `parquet:` and `text:` also take a single file (the train split). Split files
may also be called `valid.*`, `val.*` or `dev.*` (read as validation). Text is read one document
per file by default (`sample_by="document"`); `sample_by="line"` makes every line an example.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeAlias

import datasets

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

SCHEMES = ("hf", "json", "csv", "parquet", "text")
SPEC_FORMS = (
    "hf:NAME[:CONFIG]",
    "json:DIR",
    "csv:DIR",
    "parquet:DIR",
    "text:FILE_OR_DIR",
)
EXTENSIONS = {
    "json": (".jsonl", ".json", ".jsonl.gz", ".json.gz"),
    "csv": (".csv",),
    "parquet": (".parquet",),
    "text": (".txt",),
}
SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}
SAMPLE_BY = ("document", "line", "paragraph")

DatasetDicts: TypeAlias = datasets.DatasetDict | datasets.IterableDatasetDict


def load_spec(
    spec: str,
    *,
    streaming: bool = False,
    cache_dir: str | os.PathLike | None = None,
    sample_by: str = "document",
) -> DatasetDicts:
    """The dataset named by `spec`, split by split (see the module table for the forms).

    `streaming=True` gives an `IterableDatasetDict` that reads lazily (for corpora larger than
    memory); `cache_dir` is where `datasets` keeps its Arrow files and tokenization cache.
    """
    scheme, colon, rest = spec.partition(":")
    if not colon or scheme not in SCHEMES or not rest:
        raise ValueError(f"unknown data spec {spec!r}; use one of {list(SPEC_FORMS)}")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"sample_by must be one of {SAMPLE_BY}, got {sample_by!r}")
    cache = None if cache_dir is None else str(cache_dir)
    if scheme == "hf":
        return _load_hf(rest, streaming=streaming, cache_dir=cache)
    files = split_files(Path(rest), scheme)
    options = {"sample_by": sample_by} if scheme == "text" else {}
    return datasets.load_dataset(
        scheme, data_files=files, cache_dir=cache, streaming=streaming, **options
    )


def split_files(path: Path, scheme: str) -> dict[str, list[str]]:
    """`{split: [files]}` for a file (train) or a folder of `train.*`, `validation.*`, ..."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (from the data spec {scheme}:{path})")
    if path.is_file():
        return {"train": [str(path)]}
    extensions = EXTENSIONS[scheme]
    candidates = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(extensions))
    files: dict[str, list[str]] = {}
    for file in candidates:
        stem = next(file.name[: -len(ext)] for ext in extensions if file.name.endswith(ext))
        split = SPLIT_ALIASES.get(stem)
        if split is not None:
            files.setdefault(split, []).append(str(file))
    if not files and scheme == "text" and candidates:
        return {"train": [str(file) for file in candidates]}
    if "train" not in files:
        found = sorted(p.name for p in path.iterdir())
        raise FileNotFoundError(
            f"no train file in {path} for the {scheme}: scheme; expected train{extensions[0]} "
            f"(and optionally validation{extensions[0]}, test{extensions[0]}); found {found}"
        )
    return files


def _load_hf(name_and_config: str, *, streaming: bool, cache_dir: str | None) -> DatasetDicts:
    name, _, config = name_and_config.partition(":")
    local = Path(name)
    if local.is_dir() and _saved_to_disk(local):
        loaded = datasets.load_from_disk(str(local))
        if isinstance(loaded, datasets.Dataset):
            loaded = datasets.DatasetDict({"train": loaded})
        if streaming:
            return datasets.IterableDatasetDict(
                {split: part.to_iterable_dataset() for split, part in loaded.items()}
            )
        return loaded
    loaded = datasets.load_dataset(name, config or None, cache_dir=cache_dir, streaming=streaming)
    if isinstance(loaded, datasets.Dataset | datasets.IterableDataset):
        loaded = _as_dict(loaded)
    return loaded


def _saved_to_disk(folder: Path) -> bool:
    """Whether `folder` was written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _as_dict(loaded: datasets.Dataset | datasets.IterableDataset) -> DatasetDicts:
    if isinstance(loaded, datasets.IterableDataset):
        return datasets.IterableDatasetDict({"train": loaded})
    return datasets.DatasetDict({"train": loaded})
