"""Several `--data` on `zoo train`: weights are the shares of the mix (a spec without one takes
what the others leave), mixed by `datasets.interleave_datasets` seeded by `--seed` (without
weights: concatenated); a weight on a single `--data`, weights that do not add up, and
datasets with other columns or splits are refused naming `--data`."""

from __future__ import annotations

import importlib.util

import datasets
import pytest

from tests.cli.conftest import write_jsonl
from tests.cli.test_chat_train_cli import review_chats
from zoo.cli import main
from zoo.cli._mixing import STOPPING_STRATEGY, data_specs, split_weight, weights
from zoo.data import load_spec

SHOW = ["train", "gpt", "--preset", "llama-tiny", "--tokenizer", "word", "--batch-size", "1",
        "--max-len", "32", "--show-data", "1"]  # fmt: skip


def test_weights_are_shares_and_a_spec_without_one_takes_the_rest():
    assert split_weight("json:b.jsonl:0.3") == ("json:b.jsonl", 0.3)
    assert split_weight("hf:glue:sst2") == ("hf:glue:sst2", None)  # a config name, no weight
    assert weights(["json:a", "json:b:0.3"]) == pytest.approx([0.7, 0.3])
    assert weights(["json:a", "json:b:0.2", "json:c"]) == pytest.approx([0.4, 0.2, 0.4])
    assert weights(["json:a", "json:b"]) is None  # concatenated
    assert data_specs(["json:a"]) == "json:a"


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            ["json:a:0.5"],
            "--data json:a:0.5: a weight mixes several datasets, and this is the "
            "only one; drop :0.5 or add another --data",
        ),
        (["json:a:0.5", "json:b:0.4"], "the --data weights sum to 0.9, not 1"),
        (["json:a:0.7", "json:b:0.3", "json:c"], "the --data weights sum to 1, leaving nothing"),
        (["json:a:1.5", "json:b"], "--data json:a:1.5: the weight 1.5 is not a share in (0, 1]"),
    ],
)
def test_weights_that_cannot_work_are_refused_naming_data(specs, message):
    with pytest.raises(ValueError) as refused:
        data_specs(specs)
    assert message in str(refused.value)


@pytest.fixture
def two(tmp_path):
    write_jsonl(tmp_path / "a", "train", review_chats(30, seed=0))
    write_jsonl(tmp_path / "b", "train", review_chats(12, seed=5))
    return tmp_path / "a", tmp_path / "b"


def shown_count(printed: str) -> int:
    line = next(line for line in printed.splitlines() if line.startswith("lengths in tokens"))
    return int(line.split("(")[1].split()[0])


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="needs jinja2 (zoo[chat])")
def test_two_datasets_are_interleaved_by_weight_or_concatenated(two, capsys):
    first, second = two
    assert main([*SHOW, "--data", f"json:{first}", "--data", f"json:{second}:0.3"]) == 0
    mixed = shown_count(capsys.readouterr().out)
    reference = datasets.interleave_datasets(
        [load_spec(f"json:{first}")["train"], load_spec(f"json:{second}")["train"]],
        probabilities=[0.7, 0.3], seed=0, stopping_strategy=STOPPING_STRATEGY,
    )  # fmt: skip
    assert mixed == len(reference)  # the train split, before validation is held out of it
    assert main([*SHOW, "--data", f"json:{first}", "--data", f"json:{second}"]) == 0
    assert shown_count(capsys.readouterr().out) == 30 + 12  # every row once


def test_datasets_with_other_columns_or_splits_are_refused(two, tmp_path, capsys):
    first, _ = two
    write_jsonl(tmp_path / "c", "train", [{"prompt": "p", "completion": "c"}] * 4)
    assert main([*SHOW, "--data", f"json:{first}", "--data", f"json:{tmp_path / 'c'}"]) == 2
    err = capsys.readouterr().err
    assert f"--data json:{tmp_path / 'c'} has the columns ['completion', 'prompt']" in err
    write_jsonl(tmp_path / "d", "train", review_chats(4, seed=1))
    write_jsonl(tmp_path / "d", "validation", review_chats(4, seed=2))
    assert main([*SHOW, "--data", f"json:{first}", "--data", f"json:{tmp_path / 'd'}"]) == 2
    assert "mixed datasets need the same splits" in capsys.readouterr().err
