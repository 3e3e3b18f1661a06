"""`zoo train gpt --objective dpo --lora`: the base with the adapters off is the reference, on
the fly or precomputed to the same losses; gradient accumulation changes no loss; on an int8
base the first step's loss is log 2 (adapters start at zero: policy == reference)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.cli.conftest import write_jsonl
from tests.cli.test_preference_cli import sums
from zoo.cli import main

STEPS = 4
ARGS = ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "char", "--objective", "dpo",
        "--beta", "0.5", "--lora", "rank=4,alpha=8,targets=attention", "--batch-size", "8",
        "--lr", "3e-2", "--warmup", "1", "--log-every", "1", "--eval-every", "1000",
        "--no-progress", "--json"]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    write_jsonl(folder, "train", sums(48, seed=0))
    write_jsonl(folder, "validation", sums(8, seed=1))
    return folder


def train_rows(tmp_path, pairs, name: str, *extra: str, steps: int = STEPS) -> list[dict]:
    out = tmp_path / name
    argv = [*ARGS, "--data", f"json:{pairs}", "--steps", str(steps), "--out", str(out), *extra]
    assert main(argv) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == "train"]


def losses(rows: list[dict]) -> np.ndarray:
    return np.array([row["loss"] for row in rows])


def test_lora_reference_on_the_fly_precomputed_and_accumulated_agree(tmp_path, pairs, capsys):
    on_the_fly = train_rows(tmp_path, pairs, "fly")
    assert "the base with the LoRA adapters off" in capsys.readouterr().err
    precomputed = train_rows(tmp_path, pairs, "pre", "--precompute-reference")
    assert "the base (LoRA adapters off), precomputed once" in capsys.readouterr().err
    accumulated = train_rows(tmp_path, pairs, "acc", "--accumulate", "2")
    assert len(on_the_fly) == STEPS
    # the adapters start at zero: the first step's policy is its reference
    assert on_the_fly[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert on_the_fly[-1]["loss"] < on_the_fly[0]["loss"]  # the later steps moved away from it
    np.testing.assert_allclose(losses(precomputed), losses(on_the_fly), rtol=0, atol=1e-5)
    np.testing.assert_allclose(losses(accumulated), losses(on_the_fly), rtol=0, atol=1e-5)
    for left, right in zip(on_the_fly, accumulated, strict=True):
        for name in ("rewards/margins", "logps/chosen", "logps/rejected"):
            assert right["metrics"][name] == pytest.approx(left["metrics"][name], abs=1e-4)


def test_lora_dpo_on_an_int8_base_starts_at_log_2(tmp_path, pairs, capsys):
    rows = train_rows(tmp_path, pairs, "qlora", "--quantize", "int8", steps=2)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    first = rows[0]["metrics"]
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert first["rewards/accuracies"] == 0.0  # a tie is no win
    assert rows[1]["metrics"]["rewards/margins"] != 0.0  # the adapters learnt on the int8 base
