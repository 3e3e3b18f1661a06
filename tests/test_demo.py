"""The built-in synthetic tasks, greedy exact match from one pass, and `zoo demo` itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from zoo.data import synthetic
from zoo.demo import exact_match, format_table


def test_rot13_data():
    assert synthetic.rot13("hey") == "url"
    assert synthetic.rot13(synthetic.rot13("zoo")) == "zoo"
    data = synthetic.make("rot13", num_train=50, num_eval=10, seed=3)
    tokenizer = data.tokenizer
    assert data.train["src"].shape == (50, 8) and data.train["tgt"].shape == (50, 10)
    for row, (source, reference) in enumerate(data.eval_text):
        assert tokenizer.decode(data.eval["src"][row].tolist()) == source
        assert reference == synthetic.rot13(source) and 3 <= len(source) <= 8
        assert data.eval["tgt"][row][0] == tokenizer.bos_id
    train_words = {tokenizer.decode(row) for row in data.train["src"].tolist()}
    assert not train_words & {source for source, _ in data.eval_text}  # held out


def test_addition_data_scores_only_the_answer():
    data = synthetic.make("addition", num_train=20, num_eval=5, seed=1)
    tokens, mask = data.train["tokens"], data.train["loss_mask"]
    assert tokens.shape == (20, 11)  # bos 99+99=198 eos
    for row in range(20):
        text = data.tokenizer.decode(tokens[row].tolist())
        left, rest = text.split("+")
        right, answer = rest.split("=")
        assert int(answer) == int(left) + int(right)
        scored = data.tokenizer.decode(tokens[row][mask[row] == 1].tolist(), skip_special=False)
        assert scored == answer + "<eos>"
    with pytest.raises(ValueError, match="cannot draw 200 distinct"):
        synthetic.make("addition", num_train=190, num_eval=10, digits=1)


def test_majority_data_labels_the_larger_group():
    data = synthetic.make("majority", num_train=200, num_eval=10, seed=0)
    labels = data.train["labels"]
    assert 0.3 < labels.mean() < 0.7  # roughly balanced
    for row in range(20):
        text = data.tokenizer.decode(data.train["tokens"][row].tolist())
        assert len(text) % 2 == 1
        assert labels[row] == int(sum(c >= "n" for c in text) > len(text) / 2)


def test_exact_match_needs_every_scored_position():
    predictions = np.array([[5, 6, 2, 9], [5, 7, 2, 0], [5, 6, 9, 0]])
    references = np.array([[5, 6, 2, 0], [5, 6, 2, 0], [5, 6, 2, 0]])
    scored = references != 0  # the last position is padding: its prediction does not count
    assert exact_match(predictions, references, scored).tolist() == [True, False, False]


def test_table_lists_every_column():
    row = dict(flavor="gpt", task="addition", params=109312, steps=1000, seconds=41.2,
               tokens_per_s=25000.0, metric="exact match", value=0.953)  # fmt: skip
    table = format_table([row])
    assert "109,312" in table and "41.2s" in table and "25,000" in table
    assert "exact match 95.3%" in table


def test_demo_translator_reaches_its_target():
    # 500 training steps: in its own process with XLA's optimisations on, which the tests'
    # processes turn off to compile faster (tests/conftest.py), since here running dominates
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "")
    done = subprocess.run(
        [sys.executable, "-m", "zoo", "demo", "--flavor", "translator", "--json", "--no-progress"],
        env={**os.environ, "XLA_FLAGS": flags.strip()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert (row["flavor"], row["task"], row["steps"]) == ("translator", "rot13", 500)
    assert row["value"] >= 0.98, row
    assert row["tokens_per_s"] > 0
    assert " -> " in done.stderr  # held-out examples with the argmax prediction
