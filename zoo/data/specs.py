"""Data specs: one string names a dataset, `load_spec(spec)` loads it as a `DatasetDict`.

| spec | loads |
| --- | --- |
| `hf:NAME[:CONFIG]` | `datasets.load_dataset(NAME, CONFIG)`: a hub dataset, or a local folder in the hub's layout; a folder written by `save_to_disk` is read with `load_from_disk` |
| `json:DIR` | `DIR/train.jsonl` (or .json), `validation.*`, `test.*` |
| `csv:DIR` | `DIR/train.csv`, `validation.csv`, `test.csv` |
| `parquet:DIR` | `DIR/train.parquet`, `validation.parquet`, `test.parquet` |
| `text:FILE_OR_DIR` | one text file as the train split, or `DIR/train.txt`, `validation.txt`, ... (without those: every `*.txt` in DIR is train) |

`json:`, `csv:`, `parquet:` and `text:` also take a single file, read as the split
`file_split` (default train; `zoo eval` reads it as the split it evaluates). A folder needs
only the splits a command uses: training needs `train.*`, evaluating on test needs `test.*`.
Split files may also be called `valid.*`, `val.*` or `dev.*` (read as validation). Text files
are decoded as `encoding` (UTF-8 by default). Text is read one document per file by default
(`sample_by="document"`); `sample_by="line"` makes every line an example.

A file that cannot be read raises a `DataError` naming it (and its bad line or byte), and a hub
name that cannot be reached says how to get the dataset offline.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import TypeAlias

import datasets

# DatasetDict is declared as dict[str, "Dataset"]: the runtime type checker resolves that
# name in the module that annotates with it.
from datasets import Dataset  # noqa: F401

from zoo.data.errors import DataError
from zoo.data.file_errors import (
    check_csv_headers,
    check_files_not_empty,
    check_json_encoding,
    explain_load_error,
)

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
    encoding: str = "utf-8",
    file_split: str = "train",
) -> DatasetDicts:
    """The dataset named by `spec`, split by split (see the module table for the forms).

    `streaming=True` gives an `IterableDatasetDict` that reads lazily (for corpora larger than
    memory); `cache_dir` is where `datasets` keeps its Arrow files and tokenization cache.
    `encoding` decodes json, csv and text files; `file_split` names the split a single file is.
    """
    scheme, colon, rest = spec.partition(":")
    if not colon or scheme not in SCHEMES or not rest:
        raise ValueError(f"unknown data spec {spec!r}; use one of {list(SPEC_FORMS)}")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"sample_by must be one of {SAMPLE_BY}, got {sample_by!r}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(
            f"unknown encoding {encoding!r}; pass a Python codec name such as utf-8 or latin-1"
        ) from None
    cache = None if cache_dir is None else str(cache_dir)
    if scheme == "hf":
        return _load_hf(rest, streaming=streaming, cache_dir=cache)
    files = split_files(Path(rest), scheme, file_split=file_split)
    check_files_not_empty(files)
    if scheme == "json":
        check_json_encoding(files, encoding)
    if scheme == "csv":
        check_csv_headers(files, encoding)
    options: dict[str, str] = {} if scheme == "parquet" else {"encoding": encoding}
    if scheme == "text":
        options["sample_by"] = sample_by
    try:
        return datasets.load_dataset(
            scheme, data_files=files, cache_dir=cache, streaming=streaming, **options
        )
    except Exception as error:  # datasets' errors name neither the file nor the line
        raise explain_load_error(files, scheme, encoding, error) from error


def split_files(path: Path, scheme: str, *, file_split: str = "train") -> dict[str, list[str]]:
    """`{split: [files]}` for a file (`file_split`) or a folder of `train.*`, `test.*`, ..."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (from the data spec {scheme}:{path})")
    if path.is_file():
        return {file_split: [str(path)]}
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
    if not files:
        found = sorted(p.name for p in path.iterdir())
        raise FileNotFoundError(
            f"no split file in {path} for the {scheme}: scheme; expected train{extensions[0]}, "
            f"validation{extensions[0]} or test{extensions[0]}; found {found}"
        )
    return files


def check_split(dataset: DatasetDicts, split: str, spec: str) -> None:
    """`split` is in `dataset` (loaded from `spec`), else an error saying how to provide it."""
    if split in dataset:
        return
    scheme, _, rest = spec.partition(":")
    if scheme in EXTENSIONS:
        fix = f"add {split}{EXTENSIONS[scheme][0]} to {rest}, or pass one file as {scheme}:FILE"
    else:
        fix = "choose a dataset that has it"
    raise DataError(f"--data {spec} has no {split!r} split (its splits: {sorted(dataset)}); {fix}")


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
    try:
        loaded = datasets.load_dataset(
            name, config or None, cache_dir=cache_dir, streaming=streaming
        )
    except (ConnectionError, FileNotFoundError) as error:
        raise DataError(
            f"hf:{name_and_config}: the dataset cannot be loaded ({error}). Offline (no network, "
            "or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) a hub name loads only from the local "
            "cache: load it once with network access, or copy it here with "
            f"datasets.load_dataset({name!r}).save_to_disk(DIR) and pass hf:DIR; check the "
            "spelling of the name; for local files use json:, csv:, parquet: or text:"
        ) from error
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
