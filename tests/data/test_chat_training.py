"""Training on chat data: every metrics row counts the tokens its batches held and the tokens
trained (the assistant's), and the loss falls on them."""

from __future__ import annotations

import importlib.util
import json

import datasets
import jax
import numpy as np
import pytest

import zoo
from zoo.data.chat.datasets import chat_data
from zoo.data.chat.options import ChatDataConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
REVIEWS = [("a fine warm film", "positive"), ("a dull weak plot", "negative")] * 16


def expected_trained(batch: dict[str, np.ndarray]) -> int:
    """Targets scored by hand: the loss mask, within one conversation."""
    same = batch["segments"][:, 1:] == batch["segments"][:, :-1]
    return int((batch["loss_mask"][:, 1:] * same).sum())


def test_metrics_rows_count_trained_and_total_tokens(tmp_path):
    rows = [{"instruction": f"classify: {text}", "output": label} for text, label in REVIEWS]
    config = ChatDataConfig(max_len=31, batch_size=2, seed=1)
    data = chat_data(datasets.Dataset.from_list(rows), config=config)
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=data.tokenizer.vocab_size)
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-2),
                          loop=zoo.train.LoopSettings(log_every=1))  # fmt: skip
    _, history = trainer.fit(model, data.train, eval_batches=data.validation, steps=3,
                             key=jax.random.key(1),
                             outputs=zoo.train.Outputs(out_dir=tmp_path))  # fmt: skip
    train_rows = history.split("train")
    assert [row["step"] for row in train_rows] == [1, 2, 3]
    for step, row in enumerate(train_rows):
        batch = data.train.batch(step)
        assert row["tokens"] == batch["tokens"].size
        assert row["scored"] == expected_trained(batch)
        assert 0 < row["scored"] < row["tokens"]
    (evaluation,) = history.split("eval")
    batches = [data.validation.batch(step) for step in range(len(data.validation))]
    assert evaluation["scored"] == sum(expected_trained(batch) for batch in batches)
    assert evaluation["scored"] == data.counts["train holdout"]["trained_tokens"]
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert written == history.rows
