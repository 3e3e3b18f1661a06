"""Experiment loggers: TensorBoard event files and offline W&B runs hold metrics.jsonl's values."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import zoo
from tests.train.helpers import lm_batches
from zoo.cli import main
from zoo.train import LoopSettings, Outputs, Trainer, adamw


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").open()]


def expected_scalars(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """What each metrics row should become: name -> [(step, value)]."""
    named: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        split = row["split"]
        for name, value in (("loss", row["loss"]), (row["metric_name"], row["metric"]),
                            ("tokens_per_s", row["tokens_per_s"]), ("lr", row["lr"])):  # fmt: skip
            if value is not None:
                named.setdefault(f"{split}/{name}", []).append((row["step"], value))
    return named


def test_zoo_train_log_tensorboard_writes_the_metrics_as_event_scalars(tmp_path, capsys):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="reading event files needs the tensorboard package (the tensorboard extra)",
    )
    out = tmp_path / "run"
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
               "--steps", "4", "--batch-size", "8", "--log-every", "2", "--eval-every", "2",
               "--eval-limit", "1", "--log", "tensorboard", "--out", str(out),
               "--no-progress", "--json"]  # fmt: skip
    assert main(command) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4  # stdout holds only the JSON
    events = accumulator.EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    expected = expected_scalars(metrics(out))
    assert set(expected) == {"train/loss", "train/perplexity", "train/tokens_per_s", "train/lr",
                             "eval/loss", "eval/perplexity", "eval/tokens_per_s"}  # fmt: skip
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for name, points in expected.items():
        logged = [(event.step, event.value) for event in events.Scalars(name)]
        assert [step for step, _ in logged] == [step for step, _ in points] == [2, 4]
        # event files hold float32
        np.testing.assert_array_equal(
            np.float32([value for _, value in logged]), np.float32([v for _, v in points])
        )


class Recorder:
    """A logger of one's own: anything with log(row) and close()."""

    def __init__(self):
        self.rows, self.closed = [], False

    def log(self, row):
        self.rows.append(row)

    def close(self):
        self.closed = True


def wandb_records(run_file) -> list:
    """The records of an offline `.wandb` file (a LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    offset, pending, records = 7, b"", []
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if (length, kind) == (0, 0):
            break
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def wandb_history(run_file) -> dict[int, dict[str, float]]:
    """Step -> logged values, once W&B's service has written the run's exit record."""
    deadline = time.monotonic() + 60
    # run.finish() returns before the separate wandb-core process has flushed the file
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(run_file)):
        assert time.monotonic() < deadline, f"{run_file} was not completed"
        time.sleep(0.2)
    history: dict[int, dict[str, float]] = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history.setdefault(items["_step"], {}).update(items)
    return history


@pytest.mark.slow
def test_zoo_train_log_wandb_offline_writes_every_row(tmp_path):
    """W&B runs in its own process here: its service threads stay out of the test workers."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop("WANDB_PROJECT", None)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "zoo", "train", "gpt", "--preset", "gpt-tiny",
               "--data", "synthetic:addition", "--steps", "4", "--log-every", "1",
               "--eval-every", "2", "--no-progress", "--out", str(out), "--log", "wandb"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(out)
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    assert sorted(history) == [1, 2, 3, 4]
    for name, points in expected_scalars(rows).items():
        for step, value in points:
            assert history[step][name] == pytest.approx(value, rel=1e-12), (name, step)


def test_an_own_logger_gets_every_row_and_is_closed(tmp_path):
    recorder = Recorder()
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    loop = LoopSettings(log_every=1, eval_every=2, progress=False, loggers=[recorder])
    trainer = Trainer(zoo.tasks.LanguageModeling(), adamw(3e-3, warmup=3), loop=loop)
    trainer.fit(model, lm_batches(), eval_batches=lm_batches(num=16, seed=1), steps=4,
                key=jax.random.key(1), outputs=Outputs(out_dir=tmp_path))  # fmt: skip
    assert recorder.rows == metrics(tmp_path) and recorder.closed


def test_a_missing_logger_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # makes it look uninstalled
    monkeypatch.setitem(sys.modules, "wandb", None)
    command = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
               "--steps", "1", "--out", str(tmp_path / "run"), "--log", "tensorboard"]  # fmt: skip
    assert main(command) == 2
    assert capsys.readouterr().err == (
        "zoo train: error: logging to tensorboard needs the tensorboardX package: "
        "pip install 'jax-transformer-zoo[tensorboard]'\n"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        ImportError, match=r"needs the wandb package: pip install 'jax-transformer-zoo\[wandb\]'"
    ):
        LoopSettings(loggers=["wandb"])
    with pytest.raises(ValueError, match="unknown logger 'mlflow'; choose from"):
        LoopSettings(loggers=["mlflow"])
