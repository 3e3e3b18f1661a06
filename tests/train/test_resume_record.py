"""`zoo train --resume` does what the run was started with: its own tokenizer, more steps, the
same optimizer settings; else it refuses and touches nothing."""

from __future__ import annotations

import json
from pathlib import Path

from zoo.cli import main
from zoo.data.tokenizers.base import TOKENIZER_FILE, load_tokenizer

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "red", "big", "hat"]
SENTENCE = "the big dog sat on a red mat"


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(6)) for i in range(48)]
    lines = [json.dumps({"text": row}) for row in rows]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def command(data: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "word", "--data",
            f"json:{data}", "--max-len", "16", "--batch-size", "4", "--lr", "3e-3",
            "--warmup", "1", "--checkpoint-every", "2", "--eval-limit", "1", "--no-progress",
            "--json", "--steps", str(steps), "--out", str(out), *extra]  # fmt: skip


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def test_a_resumed_run_keeps_its_tokenizer_when_the_data_changed(tmp_path, capsys):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    assert main(command(data, out, 2)) == 0
    saved = load_tokenizer(out)
    ids = saved.encode(SENTENCE)
    train = data / "train.jsonl"
    # one word edited everywhere: learnt again, the vocabulary keeps its size, not its ids
    train.write_text(train.read_text().replace("hat", "zebra"))
    capsys.readouterr()
    assert main(command(data, out, 4, "--resume")) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 4
    resumed = load_tokenizer(out)
    assert resumed.state() == saved.state()
    assert resumed.encode(SENTENCE) == ids


def test_a_resumed_run_warns_of_words_its_tokenizer_does_not_know(tmp_path, capsys):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    assert main(command(data, out, 2)) == 0
    train = data / "train.jsonl"
    train.write_text(train.read_text().replace("hat", "zebra", 1))
    capsys.readouterr()
    assert main(command(data, out, 4, "--resume")) == 0
    err = capsys.readouterr().err
    assert "zoo train: 1 tokens of the training data are unknown to the run's saved" in err


def test_the_tokenizer_is_saved_when_the_run_starts(tmp_path, capsys, monkeypatch):
    from zoo.train import trainer

    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "fit", stopped)
    assert main(command(data, out, 2)) == 130
    assert load_tokenizer(out).encode("the cat") == [15, 13]  # learnt from the data


def test_a_resume_without_a_saved_tokenizer_is_refused(tmp_path, capsys):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    assert main(command(data, out, 2)) == 0
    (out / TOKENIZER_FILE).unlink()
    capsys.readouterr()
    before = folder_bytes(out)
    assert main(command(data, out, 4, "--resume")) == 2
    err = capsys.readouterr().err
    assert f"--resume: the run in {out} saved no tokenizer ({TOKENIZER_FILE})" in err
    assert folder_bytes(out) == before


def test_resume_with_steps_at_or_below_the_run_s_step_is_refused(tmp_path, capsys):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    assert main(command(data, out, 4)) == 0
    before = folder_bytes(out)
    for steps in (2, 4):
        capsys.readouterr()
        assert main(command(data, out, steps, "--resume")) == 2
        err = capsys.readouterr().err
        assert (
            f"the run in {out} is at step 4; --steps {steps} would train nothing: "
            "pass --steps above 4 to train further"
        ) in err
        assert folder_bytes(out) == before


def test_resume_with_other_optimizer_settings_is_refused(tmp_path, capsys):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    assert main(command(data, out, 2)) == 0
    recorded = json.loads((out / "train_args.json").read_text())
    before = folder_bytes(out)
    changes = [("--lr", "0.1", "0.1", "0.003"), ("--warmup", "5", "5", "1"),
               ("--weight-decay", "0.5", "0.5", str(recorded["weight_decay"])),
               ("--clip-norm", "0", "0.0", "1.0"), ("--buckets", "pow2", "pow2", "auto"),
               ("--group-by-length", None, "True", "False")]  # fmt: skip
    for flag, value, shown, started in changes:
        capsys.readouterr()
        given = (flag,) if value is None else (flag, value)
        assert main(command(data, out, 4, "--resume", *given)) == 2
        err = capsys.readouterr().err
        assert (
            f"--resume with {flag} {shown}, but the run in {out} was started with {flag} "
            f"{started} ({out / 'train_args.json'}): "
        ) in err
        assert folder_bytes(out) == before


def test_a_run_recorded_before_buckets_resumes_with_powers_of_two_and_full_heads(tmp_path):
    from zoo.cli._run_dir import run_buckets, run_group_by_length, run_loss_positions

    out = tmp_path / "run"
    out.mkdir()

    def given(buckets=None, resume=True):
        return run_buckets(buckets, out, resume=resume)

    assert given() == "auto"  # a new run
    (out / "train_args.json").write_text(json.dumps({"seed": 0}))  # before --buckets existed
    assert (given(), given(resume=False), given("48,64")) == ("pow2", "auto", "48,64")
    # nor listed the positions its chat batches score: its losses are summed as they were
    assert not run_loss_positions(out, resume=True)
    assert run_loss_positions(out, resume=False)
    # and grouped its batches by length
    grouping = [run_group_by_length(given, out, resume=resume)
                for given, resume in ((None, True), (None, False), (False, True))]  # fmt: skip
    assert grouping == [True, False, False]
    (out / "train_args.json").write_text(json.dumps({"seed": 0, "buckets": "auto"}))
    assert given() == "auto"


def test_buckets_flag_is_checked_and_reaches_the_data_options():
    import argparse

    import pytest

    from zoo.cli._datasets import DataOptions, buckets_flag

    assert buckets_flag(" 48, 64 ") == "48,64"
    for bad in ("fitted", "0,8", "8,,16", "-8"):
        with pytest.raises(argparse.ArgumentTypeError, match="give auto, pow2 or positive"):
            buckets_flag(bad)
    for flag, option in ((None, "auto"), ("auto", "auto"), ("pow2", None), ("48,64", (48, 64))):
        assert (
            DataOptions.from_args(argparse.Namespace(buckets=flag), batch_size=4).buckets == option
        )
