"""A run stopped before it saved its model (SIGTERM, Ctrl-C) leaves checkpoints only:
`zoo chat`, `zoo eval` and `zoo export` read its newest checkpoint, say so in one line, and
compute what the finished run's model computes. Its messages to continue speak CLI
(`--resume`)."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "we like tea and cake"]
NOTE = "holds no saved model (its run stopped early): using its newest checkpoint, checkpoints/"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(finished, stopped): one two-step run, and a copy without its final model, as a run
    ended by SIGTERM after its last checkpoint leaves it."""
    root = tmp_path_factory.mktemp("stopped")
    write_jsonl(root / "text", "train", [{"text": text} for text in TEXTS * 4])
    write_jsonl(root / "text", "validation", [{"text": text} for text in TEXTS])
    finished, stopped = root / "finished", root / "stopped"
    assert main(["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{root / 'text'}",
                 "--steps", "2", "--batch-size", "2", "--max-len", "32", "--out", str(finished),
                 "--checkpoint-every", "1", "--no-progress", "--json"]) == 0  # fmt: skip
    shutil.copytree(finished, stopped)
    for name in ("config.json", "model.safetensors"):
        (stopped / name).unlink()
    return root, finished, stopped


def test_eval_reads_the_newest_checkpoint_and_says_so(runs, capsys):
    root, finished, stopped = runs
    capsys.readouterr()
    scores = []
    for run in (finished, stopped):
        assert main(["eval", str(run), "--data", f"json:{root / 'text'}", "--json"]) == 0
        out, err = capsys.readouterr()
        scores.append(json.loads(out)["loss"])
        assert (f"zoo: {run} {NOTE}step_00000002" in err) == (run == stopped)
    assert scores[0] == scores[1]  # the last checkpoint is the finished model, bit for bit


def test_export_and_chat_read_the_newest_checkpoint(runs, tmp_path, capsys):
    _, finished, stopped = runs
    capsys.readouterr()
    out = tmp_path / "export"
    assert main(["export", str(stopped), "--hf", str(out), "--no-tokenizer"]) == 0
    assert NOTE in capsys.readouterr().err
    exported, final = zoo.from_pretrained(out), zoo.load(finished)
    tokens = jnp.asarray([5, 6, 7, 8], dtype=jnp.int32)
    np.testing.assert_allclose(np.asarray(exported(tokens)), np.asarray(final(tokens)), atol=1e-6)
    replies = []
    for run in (finished, stopped):
        argv = ["chat", str(run), "--message", "the cat", "--max-new-tokens", "4", "--json"]
        assert main(argv) == 0
        replies.append(json.loads(capsys.readouterr().out)["reply"])
    assert replies[0] == replies[1]


def test_a_stopped_run_is_continued_with_resume_not_started_over(runs, capsys):
    root, _, stopped = runs
    capsys.readouterr()
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--data", f"json:{root / 'text'}",
            "--steps", "2", "--batch-size", "2", "--max-len", "32", "--out", str(stopped)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "continue that run with --resume or train into a new directory" in err
    assert "resume=True" not in err
