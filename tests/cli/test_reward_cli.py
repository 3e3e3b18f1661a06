"""`zoo train classifier|gpt --objective reward` learns to score the chosen answers higher, and
bad flag mixes and bad margins are refused with the flags' names."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from tests.cli.test_preference_cli import rows, sums
from zoo.cli import main
from zoo.data.chat.preference import PreferenceDataConfig, preference_data
from zoo.data.tokenizers.base import load_tokenizer
from zoo.tasks import RewardModeling, pair_rewards
from zoo.tasks.reward_scores import model_reward

ARGS = ["--tokenizer", "char", "--objective", "reward", "--batch-size", "8", "--lr", "3e-3",
        "--warmup", "1", "--log-every", "5", "--no-progress", "--json"]  # fmt: skip


@pytest.fixture
def pairs(tmp_path):
    folder = tmp_path / "pairs"
    train = [{**row, "margin": 0.5} for row in sums(96, seed=0)]
    write_jsonl(folder, "train", train)
    write_jsonl(folder, "validation", [{**row, "margin": 0.5} for row in sums(16, seed=1)])
    return folder


def test_a_gpt_reward_model_learns_and_loads_with_its_score_head(tmp_path, pairs, capsys):
    out = tmp_path / "run"
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{pairs}", *ARGS,
               "--center-rewards-coefficient", "0.01", "--steps", "30", "--out", str(out)]  # fmt: skip
    assert main(command) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric_name"] == "accuracy"
    logged = rows(out, "train")
    assert logged[-1]["loss"] < logged[0]["loss"]
    assert set(logged[-1]["metrics"]) >= {"margin", "mean_reward", "rewards/chosen"}
    final = rows(out, "eval")[-1]
    assert final["metric"] > 0.5
    # the saved model, score head included, gives the run's last evaluation again
    model = zoo.load(out)
    assert model.config.head.scores == 1
    held = [json.loads(line) for line in (pairs / "validation.jsonl").read_text().splitlines()]
    data = preference_data({"train": held, "validation": held}, tokenizer=load_tokenizer(out),
                           config=PreferenceDataConfig(batch_size=16))  # fmt: skip
    batch = {k: jnp.asarray(v) for k, v in data.validation.batch(0).items()}
    loss, metrics = RewardModeling(center_rewards=0.01)(model, batch)
    assert float(metrics["accuracy"]) == pytest.approx(final["metric"])
    assert float(metrics["margin"]) == pytest.approx(final["metrics"]["margin"], rel=1e-4)
    assert float(loss) == pytest.approx(final["loss"], rel=1e-4)

    # zoo eval reads the run's centering and reports the same numbers
    assert main(["eval", str(out), "--data", f"json:{pairs}", "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["objective"] == "reward" and result["pairs"] == 16
    assert result["accuracy"] == pytest.approx(final["metric"])
    assert result["loss"] == pytest.approx(final["loss"], rel=1e-4)
    assert result["mean_reward"] == pytest.approx(final["metrics"]["mean_reward"], rel=1e-4)

    # as a GRPO reward: each completion scored as the pairs were in training
    reward = model_reward(model, load_tokenizer(out), batch_size=4)
    rewards, _ = pair_rewards(model, batch)
    given = reward(
        prompts=[row["prompt"] for row in held] * 2,
        completions=[row["chosen"] for row in held] + [row["rejected"] for row in held],
    )
    np.testing.assert_allclose(given, np.asarray(rewards).T.ravel(), rtol=1e-5, atol=1e-6)
    grpo = tmp_path / "grpo"
    write_jsonl(tmp_path / "prompts", "train", [{"prompt": row["prompt"]} for row in held])
    assert main(["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "char", "--data",
                 f"json:{tmp_path / 'prompts'}", "--objective", "grpo", "--reward",
                 f"model:{out}", "--num-generations", "2", "--batch-size", "4",
                 "--max-completion-len", "2", "--steps", "1", "--log-every", "1",
                 "--no-progress", "--json", "--out", str(grpo)]) == 0  # fmt: skip
    capsys.readouterr()
    assert "rewards/reward_model/mean" in rows(grpo, "train")[0]["metrics"]


def test_a_classifier_reward_model_has_one_class(tmp_path, pairs, capsys):
    out = tmp_path / "run"
    command = ["train", "classifier", "--preset", "classifier-tiny", "--data", f"json:{pairs}",
               *ARGS, "--steps", "4", "--out", str(out)]  # fmt: skip
    assert main(command) == 0
    capsys.readouterr()
    assert zoo.load(out).config.num_classes == 1
    assert rows(out, "train")[-1]["metrics"]["margin"] == pytest.approx(
        rows(out, "train")[-1]["metrics"]["rewards/chosen"]
        - rows(out, "train")[-1]["metrics"]["rewards/rejected"], abs=1e-5)  # fmt: skip


def test_with_lora_the_score_head_trains_whole(tmp_path, pairs, capsys):
    """The fresh score head trains beside the adapters: one step and two steps leave it
    different (the same seed draws the same head)."""
    heads = []
    for steps in (1, 2):
        out = tmp_path / f"run{steps}"
        command = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{pairs}", *ARGS,
                   "--lora", "rank=2", "--steps", str(steps), "--out", str(out)]  # fmt: skip
        assert main(command) == 0
        heads.append(np.asarray(zoo.load(out).score.weight))
    capsys.readouterr()
    assert np.abs(heads[0] - heads[1]).max() > 1e-6


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["translator", "--preset", "translator-tiny", "--objective", "reward"],
         "--objective reward trains a classifier or a gpt"),
        (["gpt", "--preset", "gpt-tiny", "--objective", "reward", "--beta", "0.1"],
         "--beta go with preference optimisation"),
        (["gpt", "--preset", "gpt-tiny", "--center-rewards-coefficient", "0.1"],
         "--center-rewards-coefficient goes with --objective reward"),
    ],
)  # fmt: skip
def test_bad_flag_mixes_are_refused(tmp_path, pairs, capsys, flags, message):
    command = ["train", *flags, "--data", f"json:{pairs}", "--steps", "1",
               "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(command) != 0
    assert message in capsys.readouterr().err


def test_a_margin_that_is_not_a_number_names_its_row(tmp_path, capsys):
    folder = tmp_path / "pairs"
    train = [{**row, "margin": 1.0} for row in sums(8, seed=0)]
    train[3]["margin"] = "big"
    write_jsonl(folder, "train", train)
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{folder}", *ARGS,
               "--steps", "1", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(command) != 0
    error = capsys.readouterr().err
    assert "preference row 3" in error and "'margin'" in error
