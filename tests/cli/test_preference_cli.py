"""`zoo train gpt --objective dpo` learns to prefer the chosen answers, resumes bit-exactly,
and `zoo eval` reports the same metrics on held-out pairs."""

from __future__ import annotations

import json
import random

import jax
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main


def sums(count: int, seed: int) -> list[dict]:
    """`a+b=` prompts: chosen is the sum, rejected a wrong one."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b),
                     "rejected": str(a + b + rng.choice([1, 2, -1]))})  # fmt: skip
    return rows


@pytest.fixture
def pairs(tmp_path):
    folder = tmp_path / "pairs"
    write_jsonl(folder, "train", sums(96, seed=0))
    write_jsonl(folder, "validation", sums(16, seed=1))
    return folder


ARGS = ["--preset", "gpt-tiny", "--tokenizer", "char", "--objective", "dpo", "--beta", "0.5",
        "--batch-size", "8", "--lr", "3e-3", "--warmup", "1", "--log-every", "10",
        "--no-progress", "--json"]  # fmt: skip


def rows(out, split):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == split]


def test_dpo_learns_and_resumes_bit_exactly(tmp_path, pairs, capsys):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train = ["train", "gpt", "--data", f"json:{pairs}", *ARGS]
    assert main([*train, "--steps", "30", "--out", str(whole)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric_name"] == "rewards/accuracies"
    logged = rows(whole, "train")
    assert logged[-1]["loss"] < logged[0]["loss"] < 0.75
    assert logged[-1]["metrics"]["rewards/accuracies"] > 0.5
    assert logged[-1]["metrics"]["rewards/margins"] > 0
    assert set(logged[-1]["metrics"]) >= {"rewards/chosen", "rewards/rejected", "logps/chosen",
                                          "logps/rejected"}  # fmt: skip

    assert main([*train, "--steps", "30", "--out", str(parts), "--checkpoint-every", "20",
                 "--eval-every", "1000"]) == 0  # fmt: skip
    # stop at step 20: resume from its checkpoint after removing the later one
    import shutil

    shutil.rmtree(parts / "checkpoints" / "step_00000030")
    assert main([*train, "--steps", "30", "--out", str(parts), "--checkpoint-every", "20",
                 "--eval-every", "1000", "--resume"]) == 0  # fmt: skip
    capsys.readouterr()
    left, right = zoo.load(whole), zoo.load(parts)
    for a, b in zip(jax.tree_util.tree_leaves(left), jax.tree_util.tree_leaves(right), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # zoo eval on the held-out pairs: the policy's log-probabilities are those of the run's
    # last evaluation; with the model as its own reference every reward is 0 and the loss log 2
    assert main(["eval", str(whole), "--data", f"json:{pairs}", "--reference", str(whole),
                 "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    final = rows(whole, "eval")[-1]["metrics"]
    assert result["objective"] == "dpo" and result["pairs"] == 16
    assert result["logps/chosen"] == pytest.approx(final["logps/chosen"], rel=1e-5)
    assert result["rewards/margins"] == 0 and result["loss"] == pytest.approx(np.log(2))


def test_preference_flags_need_a_preference_objective(tmp_path, pairs, capsys):
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{pairs}", "--out",
            str(tmp_path / "run"), "--beta", "0.1"]  # fmt: skip
    assert main(argv) != 0
    assert "--beta go with --objective dpo|ipo" in capsys.readouterr().err
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{pairs}", "--out",
            str(tmp_path / "run"), "--objective", "simpo", "--precompute-reference"]  # fmt: skip
    assert main(argv) != 0
    assert "reads no reference model" in capsys.readouterr().err


def test_eval_scores_with_the_runs_own_objective_and_beta(tmp_path, pairs, capsys):
    run = tmp_path / "ipo"
    args = [a if a != "dpo" else "ipo" for a in ARGS]  # IPO, beta 0.5
    assert main(["train", "gpt", "--data", f"json:{pairs}", *args, "--steps", "2",
                 "--eval-every", "1000", "--out", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", str(run), "--data", f"json:{pairs}", "--reference", str(run),
                 "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    # against itself every margin is 0: IPO's loss is (0 - 1 / (2 beta))^2 = 1 at beta 0.5
    assert result["objective"] == "ipo"
    assert result["loss"] == pytest.approx(1.0, rel=1e-6)
