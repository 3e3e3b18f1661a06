"""`zoo train gpt --objective grpo`: trains on prompt rows with rewards named on the command line,
writes samples with their rewards, resumes bit-exactly, and refuses bad rewards and flags."""

from __future__ import annotations

import json
import random
import shutil

import jax
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main


def sums(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


REWARDS = """
def digits(completions, answer, **_):
    return [sum(ch.isdigit() for ch in text) / 4 for text in completions]


def as_messages(prompts, completions, **_):
    return [float(p[0]["role"] == "user" and c[0]["role"] == "assistant")
            for p, c in zip(prompts, completions)]


def broken(completions, **_):
    return [float("nan")] * len(completions)
"""


@pytest.fixture
def prompts(tmp_path, monkeypatch):
    folder = tmp_path / "sums"
    write_jsonl(folder, "train", sums(64, seed=0))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)  # --reward my_rewards:digits is found in the working folder
    return folder


ARGS = ["--preset", "llama-tiny", "--objective", "grpo", "--reward", "my_rewards:digits",
        "--reward", "numeric:answer", "--reward-weights", "1,2", "--num-generations", "4",
        "--batch-size", "8", "--max-completion-len", "4", "--lr", "3e-3", "--warmup", "1",
        "--log-every", "1", "--no-progress", "--json"]  # fmt: skip


def test_grpo_trains_writes_samples_and_resumes_bit_exactly(tmp_path, prompts, capsys):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train = ["train", "gpt", "--data", f"json:{prompts}", *ARGS]
    assert main([*train, "--steps", "3", "--out", str(whole), "--sample-every", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric_name"] == "reward"
    logged = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    metrics = logged[0]["metrics"]
    assert {"reward", "reward_std", "rewards/digits/mean", "rewards/numeric_match_answer/mean",
            "completions/mean_length", "entropy", "clip_ratio/region_mean"} <= set(metrics)  # fmt: skip
    assert metrics["reward"] == pytest.approx(
        metrics["rewards/digits/mean"] + 2 * metrics["rewards/numeric_match_answer/mean"]
    )
    samples = [json.loads(line) for line in (whole / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 8 + [3] * 8  # steps 1 and 3 (0 and 2 done)
    assert set(samples[0]["rewards"]) == {"digits", "numeric_match_answer"}

    assert main([*train, "--steps", "3", "--out", str(parts), "--checkpoint-every", "2"]) == 0
    shutil.rmtree(parts / "checkpoints" / "step_00000003")
    assert main([*train, "--steps", "3", "--out", str(parts), "--checkpoint-every", "2",
                 "--resume"]) == 0  # fmt: skip
    capsys.readouterr()
    left, right = zoo.load(whole), zoo.load(parts)
    for a, b in zip(jax.tree_util.tree_leaves(left), jax.tree_util.tree_leaves(right), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reward", "my_rewards:broken"], "reward function 'broken' returned nan for row 0"),
        (["--reward", "my_rewards:missing"], "module 'my_rewards' has no function 'missing'"),
        (["--reward", "nowhere:f"], "cannot import module 'nowhere'"),
        (["--reward", "numeric:answer", "--num-generations", "1"],
         "--num-generations 1 makes groups of one completion"),
        (["--reward", "numeric:answer", "--batch-size", "6"],
         "--batch-size 6 counts completions"),
        ([], "--objective grpo needs a reward"),
    ],
)  # fmt: skip
def test_grpo_refuses_bad_rewards_and_flags(tmp_path, prompts, capsys, flags, message):
    argv = ["train", "gpt", "--preset", "llama-tiny", "--data", f"json:{prompts}",
            "--objective", "grpo", "--steps", "1", "--batch-size", "8", "--num-generations",
            "4", "--max-completion-len", "4", "--no-progress", "--out", str(tmp_path / "run"),
            *flags]  # fmt: skip
    assert main(argv) != 0
    assert message in capsys.readouterr().err


def test_grpo_flags_need_their_objective_and_a_gpt(tmp_path, prompts, capsys):
    argv = ["train", "classifier", "--preset", "classifier-tiny", "--data", f"json:{prompts}",
            "--objective", "grpo", "--reward", "numeric:answer", "--out", str(tmp_path / "c")]  # fmt: skip
    assert main(argv) != 0
    assert "--objective grpo trains a gpt on its own completions, not a classifier" in (
        capsys.readouterr().err
    )
    argv = ["train", "gpt", "--preset", "llama-tiny", "--data", f"json:{prompts}",
            "--num-generations", "4", "--out", str(tmp_path / "g")]  # fmt: skip
    assert main(argv) != 0
    assert "--num-generations go with --objective grpo" in capsys.readouterr().err
    write_jsonl(tmp_path / "bad", "train", [{"prompt": 3, "answer": "1"}])
    argv = ["train", "gpt", "--preset", "llama-tiny", "--data", f"json:{tmp_path / 'bad'}",
            "--objective", "grpo", "--reward", "numeric:answer", "--num-generations", "2",
            "--batch-size", "2", "--out", str(tmp_path / "b")]  # fmt: skip
    assert main(argv) != 0
    assert "prompt row 0 is 3: a prompt is a text or a list of {role, content} messages" in (
        capsys.readouterr().err
    )


def test_grpo_renders_message_prompts_with_the_chat_template(tmp_path, prompts, capsys):
    rows = [{"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]}
            for row in sums(16, seed=2)]  # fmt: skip
    write_jsonl(tmp_path / "chats", "train", rows)
    out = tmp_path / "chat-run"
    argv = ["train", "gpt", "--preset", "llama-tiny", "--data", f"json:{tmp_path / 'chats'}",
            "--objective", "grpo", "--reward", "my_rewards:as_messages", "--num-generations",
            "2", "--batch-size", "4", "--max-completion-len", "4", "--steps", "1",
            "--sample-every", "1", "--no-progress", "--json", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["metrics"]
    assert metrics["rewards/as_messages/mean"] == 1.0  # prompts and completions as messages
    assert (out / "chat_template.jinja").is_file()  # zoo's default template, kept with the run
