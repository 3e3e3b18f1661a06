"""Two processes of 4 (forced CPU) devices each train as one process of 8: `zoo train` with
`--coordinator`, the same mesh over the 8 devices, the same losses and weights, and only
process 0 writing the run's files.

Each process runs `python -m zoo train` under an audit hook that records the files it creates,
writes, renames or deletes in the run directory; process 1 may touch only its own shards in a
checkpoint's orbax `arrays/` folder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")

ROOT = Path(__file__).resolve().parents[2]
MESH = "data=2,fsdp=4"
TRAIN = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition", "--steps", "4",
         "--batch-size", "8", "--log-every", "1", "--checkpoint-every", "2", "--eval-limit", "1",
         "--mesh", MESH, "--no-progress", "--json"]  # fmt: skip
# `python -m zoo ...` that also writes, at exit, every file event under the run directory
AUDITED = """
import atexit, json, os, runpy, sys
out, log = os.path.abspath(sys.argv[1]), sys.argv[2]
sys.argv = ["zoo", *sys.argv[3:]]
seen = []
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def hook(event, args):
    if event in ("open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree"):
        target = args[1] if event == "os.rename" else args[0]  # a rename: where it lands
        path = os.path.abspath(os.fsdecode(target)) if isinstance(target, (str, bytes)) else ""
        if not path.startswith(out):
            return
        if event == "open" and not (isinstance(args[1], str) and set(args[1]) & set("wax+")
                                    or isinstance(args[2], int) and args[2] & WRITES):
            return
        seen.append([event, os.path.relpath(path, out)])
atexit.register(lambda: open(log, "w").write(json.dumps(seen)))
sys.addaudithook(hook)
runpy.run_module("zoo", run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(
        [
            env.get("XLA_FLAGS", ""),
            f"--xla_force_host_platform_device_count={devices}",
            "--xla_backend_optimization_level=0",
            "--xla_cpu_collective_call_terminate_timeout_seconds=240",
            "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120",
        ]
    )
    env["JAX_PLATFORMS"] = "cpu"
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(name, None)
    return env


def start(out: Path, log: Path, devices: int, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-c", AUDITED, str(out), str(log), *TRAIN, "--out", str(out)]
    return subprocess.Popen(
        [*command, *extra], cwd=ROOT, env=environment(devices), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[str]:
    """Each process's output; on a failure or a hang, an assertion showing all of them."""
    outputs: list[str] = []
    failed = False
    for process in processes:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            output, _ = process.communicate()
            output += "\n(killed: timed out)"
        failed |= process.returncode != 0
        outputs.append(output)
    shown = "\n".join(
        f"--- process {i} (exit {p.returncode}) ---\n"
        + "\n".join(line for line in out.splitlines() if "Gloo" not in line)[-4000:]
        for i, (p, out) in enumerate(zip(processes, outputs, strict=True))
    )
    assert not failed, shown
    return outputs


def train_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["split"] == "train"}


def weights(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(out / "model.safetensors"))


def in_shards(path: str) -> bool:
    """A path inside a checkpoint's orbax folder, where every process writes its shards."""
    parts = Path(path).parts
    return len(parts) >= 4 and parts[0] == "checkpoints" and parts[2].startswith("arrays")


@pytest.mark.slow
def test_two_processes_train_as_one_and_only_process_0_writes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    logs = [tmp_path / f"files{i}.json" for i in range(3)]
    joined = ["--coordinator", f"localhost:{free_port()}", "--num-processes", "2"]
    processes = [start(one, logs[0], 8)] + [
        start(two, logs[1 + i], 4, *joined, "--process-id", str(i)) for i in range(2)
    ]
    outputs = finish(processes)
    _, first, second = (json.loads(log.read_text()) for log in logs)

    assert train_losses(two).keys() == {1, 2, 3, 4}
    np.testing.assert_allclose(
        list(train_losses(two).values()), list(train_losses(one).values()), rtol=0, atol=1e-5
    )
    reference = weights(one)
    trained = weights(two)
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        np.testing.assert_allclose(trained[name], value, rtol=0, atol=1e-5, err_msg=name)

    # process 0 reports and writes everything; process 1 only its shards of the checkpoints
    assert json.loads(outputs[1].strip().splitlines()[-1])["steps"] == 4
    assert '"steps"' not in outputs[2]
    written = {path for _, path in first}
    for name in ("metrics.jsonl", "train_args.json", "config.json", "zoo_tokenizer.json",
                 ".zoo-train.lock", "model.safetensors", "checkpoints/.step_00000002.partial/state.json"):  # fmt: skip
        assert name in written, sorted(written)
    assert ["os.rename", "checkpoints/step_00000004"] in first  # published by process 0
    assert second and all(in_shards(path) for _, path in second), second
    assert (two / ".zoo-train.lock").read_text().strip() == str(processes[1].pid)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [
        ".zoo-train.lock", "step_00000002", "step_00000004"
    ]  # fmt: skip
