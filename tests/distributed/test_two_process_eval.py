"""`zoo eval --mesh` on two processes of 4 (forced CPU) devices each gives the metrics of
`zoo eval` in one process: a gpt's loss and perplexity, a translator's loss, token accuracy and
BLEU (its translations decoded on the mesh, the sources' rows split over both processes).
Process 0 alone prints; neither writes into the run directory.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.cli.conftest import write_jsonl
from tests.distributed.launch import file_events, finish, joined, last_json, silent, start
from zoo.cli import main

pytestmark = pytest.mark.distributed
pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")

WORDS = {"hund": "dog", "katze": "cat", "rot": "red", "blau": "blue", "läuft": "runs"}


def gpt_run(tmp_path: Path) -> tuple[list[str], list[str]]:
    """A gpt trained briefly on sums, and text to evaluate it on in blocks of 32 tokens: batches
    of 8, 8 and 2 rows, the first two split over the mesh, the last copied whole. The newlines
    are not in its vocabulary (11% unknown): a warning process 0 alone prints."""
    rng = random.Random(1)
    sums = [f"{a}+{b}={a + b}" for a, b in ((rng.randrange(100), rng.randrange(100)) for _ in range(60))]  # fmt: skip
    (tmp_path / "sums").mkdir()
    (tmp_path / "sums" / "validation.txt").write_text("\n".join(sums) + "\n")
    train = ["gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition", "--steps", "2"]
    return train, [
        "--data",
        f"text:{tmp_path / 'sums'}",
        "--split",
        "validation",
        "--max-len",
        "32",
    ]


def translator_run(tmp_path: Path) -> tuple[list[str], list[str]]:
    """A translator that learns a word-for-word dictionary well enough for a BLEU above 0 on
    8 test pairs: one batch, split over the mesh, its tokens gathered from both processes."""
    rng = random.Random(0)
    for split, count in (("train", 256), ("test", 8)):
        rows = []
        for _ in range(count):
            german = rng.choices(list(WORDS), k=rng.randint(4, 6))
            rows.append({"de": " ".join(german), "en": " ".join(WORDS[w] for w in german)})
        write_jsonl(tmp_path / "pairs", split, rows)
    train = ["translator", "--preset", "translator-tiny", "--data", f"json:{tmp_path / 'pairs'}",
             "--steps", "40", "--lr", "3e-3", "--warmup", "5", "--label-smoothing", "0",
             "--batch-size", "16", "--max-len", "16"]  # fmt: skip
    return train, ["--data", f"json:{tmp_path / 'pairs'}", "--split", "test"]


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["gpt", "translator"])
def test_eval_on_two_processes_gives_the_metrics_of_one(flavor, tmp_path, capsys):
    train, data = (gpt_run if flavor == "gpt" else translator_run)(tmp_path)
    run = tmp_path / "run"
    command = ["train", *train, "--out", str(run), "--eval-limit", "1", "--no-progress", "--json"]
    assert main(command) == 0, capsys.readouterr().err
    capsys.readouterr()
    evaluate = ["eval", str(run), *data, "--batch-size", "8", "--json"]
    assert main(evaluate) == 0, capsys.readouterr().err  # one process, one device
    alone = json.loads(capsys.readouterr().out)

    logs = [tmp_path / f"files{i}.json" for i in range(2)]
    options = [*evaluate, "--mesh", "data=2,fsdp=4", *joined()]
    outputs = finish([start(run, logs[i], 4, [*options, "--process-id", str(i)]) for i in range(2)])
    together = last_json(outputs[0])
    assert silent(outputs[1])  # no metrics, warnings or progress bars from process 1
    assert file_events(logs[0]) == file_events(logs[1]) == []  # eval writes nothing in the run

    assert together.keys() == alone.keys()
    assert together["loss"] == pytest.approx(alone["loss"], rel=0, abs=1e-5)
    assert together["unknown_token_rate"] == alone["unknown_token_rate"]
    if flavor == "gpt":
        assert alone["unknown_token_rate"] > 0.1
        text = (tmp_path / "sums" / "validation.txt").read_text()
        assert together["tokens"] == alone["tokens"] == len(text)  # every next character + eos
        assert together["perplexity"] == pytest.approx(alone["perplexity"], rel=1e-5)
    else:
        assert together["token_accuracy"] == pytest.approx(alone["token_accuracy"], abs=1e-5)
        assert alone["bleu"] > 0 and together["examples"] == alone["examples"] == 8
        assert together["bleu"] == pytest.approx(alone["bleu"], rel=0, abs=1e-9)  # same words
        assert together["samples"] == alone["samples"]
