"""`zoo eval` on preference pairs: a split smaller than `--batch-size` is scored whole, and the
losses' own settings (`--dpo-label-smoothing`, `--simpo-gamma`) mean what they mean in
`zoo train`. The pairs are one pair repeated, so every pair has the same margin and the loss
is a hand formula of the reported mean margin."""

from __future__ import annotations

import json
import math

import jax
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main
from zoo.data.tokenizers.build import build_tokenizer

PAIR = {"prompt": "2+3=", "chosen": "5", "rejected": "6"}


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Four copies of one pair, and two random gpt-tiny models (policy, reference) that read
    them with one char tokenizer."""
    root = tmp_path_factory.mktemp("eval-pairs")
    write_jsonl(root / "pairs", "train", [PAIR] * 4)
    write_jsonl(root / "pairs", "validation", [PAIR] * 4)
    tokenizer = build_tokenizer("char", ["".join(PAIR.values()) + "0123456789+="])
    for name, seed in (("policy", 1), ("reference", 2)):
        model = zoo.create("gpt-tiny", key=jax.random.key(seed), vocab_size=tokenizer.vocab_size,
                           pad_id=tokenizer.pad_id)  # fmt: skip
        zoo.save(model, root / name, tokenizer=tokenizer)
    return root


def evaluate(folders, capsys, *flags: str) -> dict:
    argv = ["eval", str(folders / "policy"), "--data", f"json:{folders / 'pairs'}", "--json"]
    assert main([*argv, *flags]) == 0  # the default --batch-size 64 holds the 4 pairs
    out, err = capsys.readouterr()
    return json.loads(out) | {"stderr": err}


def test_fewer_pairs_than_the_batch_size_are_scored_whole(folders, capsys, monkeypatch):
    reference = ["--reference", str(folders / "reference"), "--beta", "0.5"]
    monkeypatch.setattr("zoo.progress.LOG_EVERY_SECONDS", 0.0)  # a line per batch in a log
    whole = evaluate(folders, capsys, *reference)
    assert "zoo eval: 100%| 1/1 batches [" in whole["stderr"]  # stderr is no terminal
    assert whole["pairs"] == 4
    margin = whole["rewards/margins"]
    assert abs(margin) > 1e-3  # two random models: the pair has a margin
    assert whole["loss"] == pytest.approx(softplus(-margin), rel=1e-5)  # DPO: -log σ(m)
    # a partial last batch: the same numbers from batches of 3 and 1
    parts = evaluate(folders, capsys, *reference, "--batch-size", "3")
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert parts["rewards/margins"] == pytest.approx(margin, rel=1e-5)


def test_eval_takes_the_losses_own_settings(folders, capsys):
    reference = ["--reference", str(folders / "reference"), "--beta", "0.5"]
    epsilon = 0.2
    robust = evaluate(folders, capsys, *reference, "--objective", "robust",
                      "--dpo-label-smoothing", str(epsilon))  # fmt: skip
    margin = robust["rewards/margins"]
    expected = ((1 - epsilon) * softplus(-margin) - epsilon * softplus(margin)) / (1 - 2 * epsilon)
    assert robust["loss"] == pytest.approx(expected, rel=1e-5)
    # SimPO with a vanishing beta: -log σ(-γ), whatever the answers' log-probabilities
    simpo = evaluate(folders, capsys, "--objective", "simpo", "--beta", "1e-9",
                     "--simpo-gamma", "1.5")  # fmt: skip
    assert simpo["loss"] == pytest.approx(softplus(1.5), rel=1e-5)
    assert main(["eval", str(folders / "policy"), "--data", f"json:{folders / 'pairs'}",
                 "--objective", "dpo", "--simpo-gamma", "1"]) == 2  # fmt: skip
    assert "--simpo-gamma is SimPO's margin: use --objective simpo" in capsys.readouterr().err


def test_the_runs_loss_settings_go_with_the_runs_objective_only():
    import argparse

    from zoo.cli._preference import eval_preference_options, preference_loss

    record = {"objective": "robust", "beta": 0.3, "dpo_label_smoothing": 0.2, "init": "base"}

    def options(**given):
        names = ("objective", "beta", "reference", "dpo_label_smoothing", "simpo_gamma")
        return eval_preference_options(
            argparse.Namespace(**{name: given.get(name) for name in names}), record
        )

    run = options()
    assert (run.objective, run.beta, run.dpo_label_smoothing, run.reference) == (
        "robust", 0.3, 0.2, "base",
    )  # fmt: skip
    assert options(dpo_label_smoothing=0.1).dpo_label_smoothing == 0.1
    other = options(objective="dpo")  # the run's ε is robust's: DPO is scored without it
    assert other.dpo_label_smoothing is None and preference_loss(other).kind == "sigmoid"
