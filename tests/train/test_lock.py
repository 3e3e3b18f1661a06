"""One run per directory: a second `zoo train` on a locked `--out` is refused with the pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from zoo.cli import main
from zoo.train.lock import LOCK_FILE, RunLock

ROOT = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time\n"
    "from zoo.train.lock import RunLock\n"
    "RunLock(sys.argv[1]).__enter__()\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_second_run_on_the_same_out_is_refused_until_the_first_process_dies(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')  # the first run's record
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout.readline().strip() == "locked"
        second = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
                  "--steps", "1", "--out", str(out), "--no-progress"]  # fmt: skip
        assert main(second) == 2
        err = capsys.readouterr().err
        assert f"{out.resolve()} is in use by another training run (pid {first.pid}," in err
        assert "train into another directory" in err
        assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    finally:
        first.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
        first.wait()
    with RunLock(out):  # the lock died with its process
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_run_refused_by_the_lock_leaves_the_live_runs_record_alone(tmp_path, capsys):
    """The live run is before its first checkpoint; the second run differs in --lr and --seed,
    which the record must keep for the live run's --resume."""
    out = tmp_path / "run"
    out.mkdir()
    record = b'{\n  "data": "synthetic:addition",\n  "lr": 0.003,\n  "seed": 0\n}'
    (out / "train_args.json").write_bytes(record)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout.readline().strip() == "locked"
        second = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
                  "--steps", "2", "--lr", "0.5", "--seed", "9", "--out", str(out),
                  "--no-progress"]  # fmt: skip
        assert main(second) == 2
        assert f"is in use by another training run (pid {first.pid}," in capsys.readouterr().err
        assert (out / "train_args.json").read_bytes() == record
        assert sorted(path.name for path in out.iterdir()) == [LOCK_FILE, "train_args.json"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
