"""Small local datasets for the `zoo train` / `zoo eval` tests, written as the hub's files are."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

GOOD = ["good", "great", "fine", "lovely", "superb", "fun"]
BAD = ["bad", "awful", "dull", "boring", "poor", "weak"]
FILLER = ["the", "film", "movie", "plot", "was", "very", "a", "story"]


def reviews(count: int, seed: int, labels: tuple[int, ...] = (0, 1)) -> list[dict]:
    """Sentences whose label says whether good words outnumber bad ones."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        label = labels[index % len(labels)]
        words = rng.choices(FILLER, k=4) + rng.choices(GOOD if label % 2 else BAD, k=3)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(folder: Path, split: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{split}.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


@pytest.fixture
def review_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "reviews"
    write_jsonl(folder, "train", reviews(256, seed=0))
    write_jsonl(folder, "validation", reviews(40, seed=1))
    return folder


@pytest.fixture
def pairs_dir(tmp_path: Path) -> Path:
    """German-looking -> English pairs: a word-for-word dictionary, so BLEU is meaningful."""
    words = {"hund": "dog", "katze": "cat", "rot": "red", "blau": "blue", "läuft": "runs"}
    rng = random.Random(0)
    folder = tmp_path / "pairs"
    for split, count in (("train", 128), ("validation", 16), ("test", 16)):
        rows = []
        for _ in range(count):
            german = rng.choices(list(words), k=rng.randint(2, 4))
            rows.append({"de": " ".join(german), "en": " ".join(words[w] for w in german)})
        write_jsonl(folder, split, rows)
    return folder
