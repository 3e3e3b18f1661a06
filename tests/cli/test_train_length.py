"""`zoo train --epochs N` (the steps follow from the data: N times its batches per epoch, one
optimizer step a batch, said in one line; a resume counts on from the checkpoint) and
`--gradient-checkpointing` (`--set remat=full` as a flag)."""

from __future__ import annotations

import json

import jax
import pytest
import yaml

from tests.cli.conftest import reviews, write_jsonl
from zoo.cli import build_parser, main
from zoo.cli._build import build_model
from zoo.cli._plan import plan

TINY = ["--preset", "gpt-tiny", "--set", "d_model=16", "--set", "num_layers=1", "--max-len", "16",
        "--eval-limit", "1", "--no-progress", "--json"]  # fmt: skip


def batches_per_epoch(argv: list[str]) -> int:
    """The training batches of one epoch of the run of `argv`, counted from the built data."""
    decided = plan(build_parser().parse_args(argv))
    built = build_model(decided.model, decided.data, decided.data_options, jax.random.key(0))
    return len(built.data.train)


@pytest.mark.slow
def test_epochs_give_the_steps_and_a_resume_counts_on(tmp_path, capsys):
    out, data = tmp_path / "run", tmp_path / "reviews"
    write_jsonl(data, "train", reviews(48, seed=0))
    write_jsonl(data, "validation", reviews(8, seed=1))
    argv = ["train", "gpt", "--data", f"json:{data}", "--batch-size", "16", *TINY,
            "--out", str(out)]  # fmt: skip
    per_epoch = batches_per_epoch([*argv, "--steps", "1"])
    assert per_epoch > 1
    assert main([*argv, "--epochs", "1"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"] == per_epoch
    said = f"zoo train: --epochs 1: {per_epoch} batches of 16 an epoch, so {per_epoch} steps"
    assert said in captured.err
    recorded = yaml.safe_load((out / "train_config.yaml").read_text())
    assert (recorded["epochs"], recorded["steps"]) == (1, None)  # reruns as --epochs 1
    assert main([*argv, "--epochs", "2", "--resume"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert (resumed["resumed_from"], resumed["steps"]) == (per_epoch, 2 * per_epoch)
    assert main([*argv, "--epochs", "2", "--resume"]) == 2
    assert (
        f"is at step {2 * per_epoch}; --epochs 2 ({2 * per_epoch} steps) would train nothing: "
        "pass more --epochs"
    ) in capsys.readouterr().err


def test_epochs_and_steps_are_one_or_the_other(tmp_path, capsys):
    argv = ["train", "gpt", "--data", "synthetic:addition", "--out", str(tmp_path / "r")]
    assert main([*argv, "--epochs", "1", "--steps", "5"]) == 2
    assert "--epochs 1 and --steps 5 both say how long to train: give one" in (
        capsys.readouterr().err
    )
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 2\nlr: 0.5\n", encoding="utf-8")
    parser = build_parser()
    from_file = parser.parse_args(["train", "gpt", "--config", str(config), "--steps", "7"])
    assert (from_file.steps, from_file.epochs, from_file.lr) == (7, None, 0.5)  # the line wins
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "gpt", "--epochs", "0"])
    assert "--epochs takes a positive number, got 0" in capsys.readouterr().err


def test_gradient_checkpointing_is_remat_full(tmp_path, capsys):
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition", "--out",
            str(tmp_path / "r"), "--steps", "1", "--gradient-checkpointing"]  # fmt: skip
    decided = plan(build_parser().parse_args([*argv, "--set", "num_layers=1"]))
    assert decided.model.settings == ("num_layers=1", "remat=full")
    again = plan(build_parser().parse_args([*argv, "--set", "remat=full"]))
    assert again.model.settings == ("remat=full",)  # said twice, the same
    built = build_model(decided.model, decided.data, decided.data_options, jax.random.key(0))
    assert built.model.config.remat == "full"
    assert main([*argv, "--set", "remat=dots"]) == 2
    assert (
        "--gradient-checkpointing is --set remat=full, and --set remat=dots asks for another"
    ) in capsys.readouterr().err
