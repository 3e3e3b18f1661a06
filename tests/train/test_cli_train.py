"""`zoo train`: a run, then `--resume` to more steps; clear errors for bad data specs."""

from __future__ import annotations

import json

import jax

import zoo
from zoo.cli import main
from zoo.data import synthetic
from zoo.data.tokenizers.base import load_tokenizer
from zoo.train import list_checkpoints
from zoo.train.lock import LOCK_FILE


def test_train_then_resume(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
              "--out", str(out), "--batch-size", "16", "--lr", "3e-3", "--warmup", "2",
              "--log-every", "1", "--checkpoint-every", "2", "--eval-limit", "1",
              "--no-progress", "--json"]  # fmt: skip
    assert main([*common, "--steps", "4"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["steps"], first["resumed_from"], first["metric_name"]) == (4, 0, "perplexity")
    assert main([*common, "--steps", "6", "--resume"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["steps"], second["resumed_from"]) == (6, 4)
    assert second["train_loss"] < first["train_loss"]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if r["split"] == "eval"] == [4, 6]
    assert [step for step, _ in list_checkpoints(out / "checkpoints")] == [2, 4, 6]
    model = zoo.load(out)
    tokenizer = load_tokenizer(out)
    # vocabulary and special ids come from the data's tokenizer ("0123456789+=" + 4 specials)
    assert model.config.vocab_size == tokenizer.vocab_size == 16
    assert (model.config.pad_id, model.config.bos_id, model.config.eos_id) == (0, 1, 2)


def test_bad_data_specs_are_explained(tmp_path, capsys):
    base = ["train", "gpt", "--preset", "gpt-tiny", "--steps", "1", "--out", str(tmp_path)]
    assert main([*base, "--data", "json:file.jsonl"]) == 2
    assert "file.jsonl does not exist" in capsys.readouterr().err
    assert main([*base, "--data", "addition"]) == 2
    assert "is not SCHEME:NAME" in capsys.readouterr().err
    assert main([*base, "--data", "synthetic:rot13"]) == 2
    assert "synthetic:rot13 trains a translator, not a gpt" in capsys.readouterr().err
    assert main([*base, "--data", "synthetic:sorting"]) == 2
    assert "unknown synthetic task 'sorting'" in capsys.readouterr().err
    wrong_preset = ["train", "translator", "--preset", "gpt-tiny", "--data", "synthetic:rot13",
                    "--steps", "1", "--out", str(tmp_path)]  # fmt: skip
    assert main(wrong_preset) == 2
    assert "preset 'gpt-tiny' is a gpt, not a translator" in capsys.readouterr().err


def test_a_fresh_run_refuses_a_folder_holding_a_saved_model(tmp_path, capsys):
    data = synthetic.make("addition")
    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=data.tokenizer.vocab_size)
    folder = zoo.save(model, tmp_path / "model", tokenizer=data.tokenizer)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    base = ["train", "gpt", "--data", "synthetic:addition", "--steps", "1", "--no-progress"]
    for start in (["--init", str(folder)], ["--preset", "gpt-tiny"]):  # --out equal to --init
        assert main([*base, *start, "--out", str(folder)]) == 2
        err = capsys.readouterr().err
        assert "already holds a saved model (config.json, model.safetensors)" in err
        assert "training would overwrite it. Train into a new directory" in err
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.name in before} == (
        before
    )


def test_a_refused_fresh_run_writes_nothing_into_a_folder_holding_a_saved_model(tmp_path, capsys):
    data = synthetic.make("addition")
    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=data.tokenizer.vocab_size)
    finished = zoo.save(model, tmp_path / "finished", tokenizer=data.tokenizer)
    record = b'{\n  "lr": 0.003,\n  "seed": 0\n}'  # the record of the run that saved it
    (finished / "train_args.json").write_bytes(record)
    bare = zoo.save(model, tmp_path / "bare", tokenizer=data.tokenizer)  # saved by zoo.save
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
               "--steps", "1", "--lr", "0.5", "--seed", "9", "--no-progress"]  # fmt: skip
    for folder in (finished, bare):
        before = {path.name: path.read_bytes() for path in folder.iterdir()}
        assert main([*command, "--out", str(folder)]) == 2
        assert "already holds a saved model" in capsys.readouterr().err
        # no train_args.json written or rewritten, no checkpoints/ made
        assert sorted(path.name for path in folder.iterdir() if path.name != LOCK_FILE) == sorted(
            before
        )
        assert {name: (folder / name).read_bytes() for name in before} == before
