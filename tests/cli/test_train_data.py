"""`zoo train` on real files: every shared dataset, a local hub-format folder, --init, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zoo
from tests.cli.conftest import reviews, write_jsonl
from tests.data.shared_paths import SHARED_DATA, needs_shared_data
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer

FAST = ["--steps", "2", "--batch-size", "8", "--max-len", "16", "--eval-limit", "1",
        "--log-every", "1", "--no-progress", "--json"]  # fmt: skip


def _train(capsys, *argv: str) -> dict:
    assert main(["train", *argv, *FAST]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@needs_shared_data
@pytest.mark.parametrize(
    "flavor, data, extra",
    [
        ("classifier", "json:{}/rotten_tomatoes", ["--min-freq", "2"]),
        ("translator", "json:{}/multi30k", ["--source", "de", "--target", "en"]),
        ("gpt", "text:{}/tiny_shakespeare", ["--tokenizer", "char"]),
    ],
)
def test_each_shared_dataset_trains(tmp_path, capsys, flavor, data, extra):
    out = tmp_path / flavor
    spec = data.format(SHARED_DATA)
    summary = _train(capsys, flavor, "--preset", f"{flavor}-tiny", "--data", spec,
                     "--out", str(out), *extra)  # fmt: skip
    assert summary["steps"] == 2 and np.isfinite(summary["eval_loss"])
    model, tokenizer = zoo.load(out), load_tokenizer(out)
    assert model.config.max_positions == 16
    if flavor == "translator":  # one vocabulary per language, from the data
        assert model.config.vocab_size == tokenizer.source.vocab_size > 1000
        assert model.config.target_vocab_size == tokenizer.vocab_size > 1000
        assert not model.config.share_embeddings
    else:
        assert model.config.vocab_size == tokenizer.vocab_size
    if flavor == "classifier":
        assert model.config.num_classes == 2
    if flavor == "gpt":
        assert tokenizer.vocab_size == 69  # 65 characters + pad, bos, eos, unk


def test_hub_format_folder(tmp_path, capsys):
    import datasets

    folder = tmp_path / "hub"
    (folder / "data").mkdir(parents=True)
    for split, seed in (("train", 0), ("validation", 1)):
        rows = reviews(64, seed=seed, labels=(0, 1, 2))
        table = datasets.Dataset.from_list(rows)
        table.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    summary = _train(capsys, "classifier", "--preset", "classifier-tiny",
                     "--data", f"hf:{folder}", "--out", str(tmp_path / "run"))  # fmt: skip
    assert zoo.load(tmp_path / "run").config.num_classes == 3
    assert summary["metric_name"] == "accuracy"


def test_defaults_come_from_the_preset(tmp_path, capsys, review_dir):
    argv = ["train", "classifier", "--preset", "classifier-small", "--data", f"json:{review_dir}",
            "--out", str(tmp_path / "run"), "--steps", "3", "--no-progress", "--max-len", "16",
            "--batch-size", "8", "--set", "num_layers=1"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "schedule=cosine" in err and "min_freq=2" in err and "lowercase=True" in err
    assert "steps=" not in err and "batch_size" not in err and "max_len" not in err
    assert "warmup=1," in err  # the preset's 100 warmup steps shrink to fit a 3-step run


def test_init_continues_from_saved_weights(tmp_path, capsys, review_dir):
    first = tmp_path / "first"
    _train(capsys, "classifier", "--preset", "classifier-tiny", "--data", f"json:{review_dir}",
           "--out", str(first), "--lr", "3e-3")  # fmt: skip
    saved = zoo.load(first)
    second = tmp_path / "second"
    _train(capsys, "classifier", "--init", str(first), "--data", f"json:{review_dir}",
           "--out", str(second))  # fmt: skip
    # the first logged loss is the saved model's loss on batch 0 of the same data
    data = zoo.data.from_hf(
        zoo.data.load_spec(f"json:{review_dir}"), task="classification",
        tokenizer=load_tokenizer(first), batch_size=8, max_len=16,
    )  # fmt: skip
    loss, _ = zoo.tasks.Classification()(saved, data.train.batch(0))
    rows = [json.loads(line) for line in (second / "metrics.jsonl").open()]
    assert rows[0]["step"] == 1
    np.testing.assert_allclose(rows[0]["loss"], float(loss), rtol=1e-5)


def test_init_with_other_classes_reinitialises_the_head(tmp_path, capsys, review_dir):
    first = tmp_path / "first"
    _train(capsys, "classifier", "--preset", "classifier-tiny", "--data", f"json:{review_dir}",
           "--out", str(first))  # fmt: skip
    three = tmp_path / "three"
    write_jsonl(three, "train", reviews(64, seed=2, labels=(0, 1, 2)))
    write_jsonl(three, "validation", reviews(12, seed=3, labels=(0, 1, 2)))
    out = tmp_path / "second"
    argv = ["train", "classifier", "--init", str(first), "--data", f"json:{three}", "--out",
            str(out), "--freeze", "embeddings,layers:0-1", *FAST]  # fmt: skip
    assert main(argv) == 0
    assert "re-initialised" in capsys.readouterr().err
    before, after = zoo.load(first), zoo.load(out)
    assert after.config.num_classes == 3 and after.head.weight.shape == (3, 64)
    # frozen: embeddings and both blocks, bit for bit
    np.testing.assert_array_equal(after.embedder.token_weight, before.embedder.token_weight)
    np.testing.assert_array_equal(
        after.encoder.blocks.feed_forward.hidden.weight,
        before.encoder.blocks.feed_forward.hidden.weight,
    )


def test_errors_are_explained(tmp_path, capsys, review_dir):
    base = ["train", "classifier", "--preset", "classifier-tiny", "--out", str(tmp_path / "r"),
            "--steps", "1", "--no-progress"]  # fmt: skip
    assert main([*base, "--data", f"json:{review_dir}", "--text-column", "review"]) == 2
    err = capsys.readouterr().err
    assert "review" in err and "'text'" in err and "'label'" in err
    assert main([*base, "--data", f"json:{review_dir}", "--init", str(tmp_path / "nope")]) == 2
    assert f"--init {tmp_path / 'nope'} is not a model directory (no such folder)" in (
        capsys.readouterr().err
    )
    bad = tmp_path / "bad"
    write_jsonl(bad, "train", reviews(32, seed=0))
    write_jsonl(bad, "validation", reviews(8, seed=1, labels=(0, 5)))
    assert main([*base, "--data", f"json:{bad}"]) == 2
    assert "num_classes" in capsys.readouterr().err
    assert main([*base, "--data", f"json:{review_dir}", "--source", "de"]) == 2
    assert "--source/--target" in capsys.readouterr().err
