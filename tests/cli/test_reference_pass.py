"""`--precompute-reference`: the pass reports its progress (lines in a log, a bar on a
terminal), keeps its numbers in the run folder, and `--resume` reads them back while their
digest matches the reference and the pairs, computing them again (and saying why) otherwise."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from tests.cli.conftest import write_jsonl
from tests.cli.test_preference_cli import sums
from zoo.cli import _reference_pass, main
from zoo.tasks.preference_reference import reference_numbers

ARGS = ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "char", "--objective", "dpo",
        "--batch-size", "8", "--lr", "3e-3", "--warmup", "1", "--log-every", "1",
        "--eval-every", "1000", "--checkpoint-every", "1", "--no-progress", "--json",
        "--precompute-reference"]  # fmt: skip


@pytest.fixture
def counted(monkeypatch):
    """How many splits the reference pass computed (train and validation: 2 a pass)."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return reference_numbers(*args, **kwargs)

    monkeypatch.setattr(_reference_pass, "reference_numbers", counting)
    return calls


def train_rows(out) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == "train"]


def test_the_pass_is_kept_reused_on_resume_and_redone_for_other_pairs(tmp_path, capsys, counted):
    pairs, out = tmp_path / "pairs", tmp_path / "run"
    write_jsonl(pairs, "train", sums(40, seed=0))
    write_jsonl(pairs, "validation", sums(8, seed=1))
    command = [*ARGS, "--data", f"json:{pairs}", "--out", str(out)]
    assert main([*command, "--steps", "2"]) == 0
    err = capsys.readouterr().err
    assert len(counted) == 2  # train and validation
    # a log (stderr is no terminal): a line as it starts and one as it ends, with the rate
    assert "zoo train: reference pass: 6 batches" in err  # 5 of train, 1 of validation
    assert "zoo train: reference pass: done, 6 batches in " in err and "batches/s)" in err
    saved = out / _reference_pass.REFERENCE_FILE
    assert saved.is_file()
    with np.load(saved, allow_pickle=False) as held:
        assert held["train"].shape == (40, 2) and held["validation"].shape == (8, 2)
        assert np.all(held["train"] < 0)  # log-probabilities

    assert main([*command, "--steps", "3", "--resume"]) == 0
    err = capsys.readouterr().err
    assert len(counted) == 2  # nothing computed again
    assert f"reference log-probabilities read from {saved} (its digest matches)" in err
    assert "reference pass" not in err
    assert len(train_rows(out)) == 3

    write_jsonl(pairs, "train", sums(40, seed=5))  # other pairs, the same characters
    assert main([*command, "--steps", "4", "--resume"]) == 0
    err = capsys.readouterr().err
    assert len(counted) == 4
    assert f"{saved} is not this run's reference (the tokenized pairs changed): computing it " \
        "again" in err  # fmt: skip
    assert "reference pass: done, 6 batches in " in err


def test_a_changed_reference_is_seen_by_its_digest(tmp_path, capsys):
    import jax

    import zoo
    from zoo.data import ArrayBatches
    from zoo.data.chat.preference import PreferencePair, pair_arrays

    pairs = [PreferencePair([1, 5], [6, 7, 2], [8, 2]), PreferencePair([1, 9], [12, 2], [13, 2])]
    batches = ArrayBatches(pair_arrays(pairs, 0), batch_size=2, shuffle=False)
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=32, max_positions=16)
    other = zoo.create("llama-tiny", key=jax.random.key(1), vocab_size=32, max_positions=16)
    first = _reference_pass.precomputed({"train": batches}, model, out=tmp_path, progress=False)
    again = _reference_pass.precomputed({"train": batches}, model, out=tmp_path, progress=False)
    np.testing.assert_array_equal(first["train"].arrays["reference_logps"],
                                  again["train"].arrays["reference_logps"])  # fmt: skip
    assert "read from" in capsys.readouterr().err
    changed = _reference_pass.precomputed({"train": batches}, other, out=tmp_path, progress=False)
    assert "(the reference's weights changed): computing it again" in capsys.readouterr().err
    assert not np.allclose(changed["train"].arrays["reference_logps"],
                           first["train"].arrays["reference_logps"])  # fmt: skip
    (tmp_path / _reference_pass.REFERENCE_FILE).write_bytes(b"not a zip")
    _reference_pass.precomputed({"train": batches}, other, out=tmp_path, progress=False)
    assert "(the file cannot be read: " in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_lines_in_a_log_and_a_bar_on_a_terminal(monkeypatch):
    monkeypatch.setattr(_reference_pass, "LINE_EVERY_S", 0.0)  # a line after every batch
    log = io.StringIO()
    progress = _reference_pass.pass_progress(3, shown=True, stream=log)
    for _ in range(3):
        progress.advance()
    _reference_pass.finish(progress)
    lines = log.getvalue().splitlines()
    assert lines[0] == "zoo train: reference pass: 3 batches"
    assert " 1/3 batches [" in lines[1] and " 2/3 batches [" in lines[2]
    assert " 3/3 batches [" in lines[3]
    assert all(line.startswith("zoo train: reference pass: ") for line in lines)
    assert all("batches/s" in line for line in lines[1:4])
    assert lines[4].startswith("zoo train: reference pass: done, 3 batches in ")
    terminal = Terminal()
    progress = _reference_pass.pass_progress(3, shown=True, stream=terminal)
    for _ in range(3):
        progress.advance()
    _reference_pass.finish(progress)
    shown = terminal.getvalue()
    assert "3/3" in shown and "\r" in shown  # tqdm redraws its bar in place
    assert " 1/3 batches [" not in shown.replace("\r", "\n").splitlines()[0]
    quiet = io.StringIO()  # --no-progress: the first and the last line only
    progress = _reference_pass.pass_progress(3, shown=False, stream=quiet)
    for _ in range(3):
        progress.advance()
    _reference_pass.finish(progress)
    lines = quiet.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("zoo train: reference pass: done, 3 batches")
