"""Data specs: every scheme loads the splits it should; bad specs and paths say what is wrong."""

from __future__ import annotations

import json

import datasets
import pytest

from zoo.data import DataError, from_hf, load_spec
from zoo.data.specs import check_split

ROWS = {
    "train": [{"text": "good fun", "label": 1}, {"text": "dull", "label": 0}],
    "validation": [{"text": "fine", "label": 1}],
    "test": [{"text": "awful", "label": 0}],
}


def write_jsonl(folder, rows_by_split, suffix=".jsonl"):
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in rows_by_split.items():
        text = "".join(json.dumps(row) + "\n" for row in rows)
        (folder / f"{split}{suffix}").write_text(text)
    return folder


def sizes(loaded):
    return {split: part.num_rows for split, part in loaded.items()}


def test_json_dir(tmp_path):
    folder = write_jsonl(tmp_path / "reviews", ROWS)
    loaded = load_spec(f"json:{folder}", cache_dir=tmp_path / "cache")
    assert isinstance(loaded, datasets.DatasetDict)
    assert sizes(loaded) == {"train": 2, "validation": 1, "test": 1}
    assert loaded["train"]["text"][:] == ["good fun", "dull"]


def test_json_single_file_and_dev_alias(tmp_path):
    folder = write_jsonl(tmp_path / "d", {"train": ROWS["train"], "dev": ROWS["validation"]})
    assert sizes(load_spec(f"json:{folder}", cache_dir=tmp_path / "c")) == {
        "train": 2,
        "validation": 1,
    }
    single = load_spec(f"json:{folder / 'train.jsonl'}", cache_dir=tmp_path / "c")
    assert sizes(single) == {"train": 2}


def test_csv_and_parquet_dirs(tmp_path):
    frame = datasets.Dataset.from_list(ROWS["train"])
    (tmp_path / "csv").mkdir()
    (tmp_path / "pq").mkdir()
    frame.to_csv(tmp_path / "csv" / "train.csv", index=False)
    frame.to_parquet(tmp_path / "pq" / "train.parquet")
    datasets.Dataset.from_list(ROWS["test"]).to_parquet(tmp_path / "pq" / "test.parquet")
    csv = load_spec(f"csv:{tmp_path / 'csv'}", cache_dir=tmp_path / "c")
    parquet = load_spec(f"parquet:{tmp_path / 'pq'}", cache_dir=tmp_path / "c")
    assert csv["train"][1] == {"text": "dull", "label": 0}
    assert sizes(parquet) == {"train": 2, "test": 1}


def test_text_file_is_one_document_or_lines(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_text("line one\nline two\n\nline four\n")
    whole = load_spec(f"text:{path}", cache_dir=tmp_path / "c")
    assert whole["train"]["text"][:] == ["line one\nline two\n\nline four\n"]
    lines = load_spec(f"text:{path}", cache_dir=tmp_path / "c", sample_by="line")
    assert lines["train"].num_rows == 4


def test_hf_local_folder_in_hub_layout(tmp_path):
    """A hub dataset repo converted to parquet: data/<split>-00000-of-00001.parquet."""
    repo = tmp_path / "user__reviews"
    (repo / "data").mkdir(parents=True)
    for split, rows in ROWS.items():
        datasets.Dataset.from_list(rows).to_parquet(
            repo / "data" / f"{split}-00000-of-00001.parquet"
        )
    loaded = load_spec(f"hf:{repo}", cache_dir=tmp_path / "cache")
    assert sizes(loaded) == {"train": 2, "validation": 1, "test": 1}
    data = from_hf(loaded, task="classification", tokenizer="char", batch_size=1, max_len=8)
    assert data.num_classes == 2
    assert data.validation.batch(0)["labels"].tolist() == [1]
    streamed = load_spec(f"hf:{repo}", cache_dir=tmp_path / "cache", streaming=True)
    assert isinstance(streamed, datasets.IterableDatasetDict)
    assert [row["text"] for row in streamed["train"]] == ["good fun", "dull"]


def test_hf_folder_from_save_to_disk(tmp_path):
    saved = datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in ROWS.items()})
    saved.save_to_disk(tmp_path / "saved")
    loaded = load_spec(f"hf:{tmp_path / 'saved'}")
    assert sizes(loaded) == {"train": 2, "validation": 1, "test": 1}
    streamed = load_spec(f"hf:{tmp_path / 'saved'}", streaming=True)
    assert next(iter(streamed["test"]))["text"] == "awful"


def test_unknown_scheme_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'s3:bucket'.*hf:NAME\[:CONFIG\].*json:DIR.*text:"):
        load_spec("s3:bucket")
    with pytest.raises(ValueError, match="unknown data spec"):
        load_spec("rotten_tomatoes")


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        load_spec(f"json:{missing}")


def test_a_folder_needs_only_the_splits_used(tmp_path):
    # evaluating on a held-out file is the common case: no train file needed to load
    folder = write_jsonl(tmp_path / "d", {"test": ROWS["test"]})
    assert sizes(load_spec(f"json:{folder}", cache_dir=tmp_path / "c")) == {"test": 1}
    single = load_spec(f"json:{folder / 'test.jsonl'}", file_split="test", cache_dir=tmp_path)
    assert sizes(single) == {"test": 1}
    with pytest.raises(DataError, match=r"no 'train' split \(its splits: \['test'\]\); add "
                       r"train.jsonl to .*d, or pass one file as json:FILE"):  # fmt: skip
        check_split(
            load_spec(f"json:{folder}", cache_dir=tmp_path / "c"), "train", f"json:{folder}"
        )


def test_folder_without_split_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.md").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"no split file.*train.jsonl.*notes.md"):
        load_spec(f"json:{tmp_path / 'd'}")


def test_bad_sample_by():
    with pytest.raises(ValueError, match="sample_by"):
        load_spec("text:/tmp", sample_by="sentence")


def test_tokenization_is_cached_between_runs(tmp_path):
    folder = write_jsonl(
        tmp_path / "reviews", {"train": ROWS["train"] * 4, "validation": ROWS["validation"]}
    )
    cache = tmp_path / "cache"

    def run():
        loaded = load_spec(f"json:{folder}", cache_dir=cache)
        data = from_hf(loaded, task="classification", tokenizer="word", batch_size=2)
        files = sorted(cache.rglob("cache-*.arrow"))
        return data.train.batch(0)["tokens"], {f: f.stat().st_mtime_ns for f in files}

    first_tokens, first_files = run()
    second_tokens, second_files = run()
    assert len(first_files) == 2  # one tokenized file per split
    assert second_files == first_files  # the second run read them back, unchanged
    assert (first_tokens == second_tokens).all()


def test_hf_spec_passes_name_and_config(monkeypatch, tmp_path):
    calls = []

    def fake_load_dataset(name, config, *, cache_dir, streaming):
        calls.append((name, config, cache_dir, streaming))
        return datasets.Dataset.from_list(ROWS["train"])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = load_spec("hf:nyu-mll/glue:sst2", cache_dir=tmp_path)
    assert calls == [("nyu-mll/glue", "sst2", str(tmp_path), False)]
    assert sizes(loaded) == {"train": 2}  # a single split comes back as train
    load_spec("hf:rotten_tomatoes", streaming=True)
    assert calls[-1] == ("rotten_tomatoes", None, None, True)
