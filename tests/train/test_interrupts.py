"""Ctrl-C and SIGTERM: a checkpoint write finishes (or is redone), then the run stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import pytest

from tests.train.helpers import lm_batches
from zoo.train import Outputs, checkpoint_folder, list_checkpoints
from zoo.train import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_during_a_periodic_checkpoint_write_finishes_that_write(
    tmp_path, tiny_gpt, lm_trainer, monkeypatch
):
    real_sync = checkpoint_folder.sync_files

    def sync_hit_by_ctrl_c(directory):  # the files of step 2 are written, not yet published
        os.kill(os.getpid(), signal.SIGINT)
        real_sync(directory)

    monkeypatch.setattr(checkpoint_folder, "sync_files", sync_hit_by_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        lm_trainer.fit(
            tiny_gpt, lm_batches(), steps=10, key=jax.random.key(0), outputs=Outputs(tmp_path)
        )
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".step")) == []


def test_a_checkpoint_write_cut_short_is_written_again_on_interrupt(
    tmp_path, tiny_gpt, lm_trainer, monkeypatch
):
    real_save = ckpt.save_checkpoint
    calls = []

    def save_cut_short_once(directory, **options):  # a second Ctrl-C lands inside the write
        calls.append(options["step"])
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_save(directory, **options)

    monkeypatch.setattr(ckpt, "save_checkpoint", save_cut_short_once)
    with pytest.raises(KeyboardInterrupt):
        lm_trainer.fit(
            tiny_gpt, lm_batches(), steps=10, key=jax.random.key(0), outputs=Outputs(tmp_path)
        )
    assert calls == [2, 2]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def train_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def start_endless_run(out: Path) -> subprocess.Popen:
    """`zoo train` in a child process, logging every step, with more steps than a test waits."""
    command = [sys.executable, "-m", "zoo", "train", "gpt", "--preset", "gpt-tiny",
               "--data", "synthetic:addition", "--steps", "100000", "--batch-size", "4",
               "--log-every", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_zoo_train_stops_on_sigterm_with_a_checkpoint_and_exit_status_143(tmp_path):
    out = tmp_path / "run"
    process = start_endless_run(out)
    try:
        wait_for(lambda: len(train_rows(out)) >= 2, 120, "two logged steps")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "terminated (SIGTERM); continue with --resume" in stderr
    saved = list_checkpoints(out / "checkpoints")
    assert len(saved) == 1
    # The checkpoint holds every step trained: the newest logged row is its step.
    assert saved[0][0] == train_rows(out)[-1]["step"] >= 2


@pytest.mark.slow
def test_ctrl_c_pressed_again_after_the_save_exits_quietly(tmp_path):
    out = tmp_path / "run"
    process = start_endless_run(out)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(train_rows(out)) >= 2, 120, "two logged steps")
        process.send_signal(signal.SIGINT)
        wait_for(lambda: any("interrupted: saved" in line for line in lines), 60, "the save")
        while process.poll() is None:  # Ctrl-C pressed again and again while it exits
            process.send_signal(signal.SIGINT)
            time.sleep(0.005)
        reader.join(timeout=10)
    finally:
        process.kill()
    stderr = "".join(lines)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.rstrip().endswith("zoo train: interrupted; continue with --resume"), stderr
    assert len(list_checkpoints(out / "checkpoints")) == 1
