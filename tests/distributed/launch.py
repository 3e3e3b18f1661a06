"""Launching `python -m zoo ...` as processes of one run on forced CPU devices, for the
two-process tests: a free coordinator port, the environment, and each process's output.

Each process runs under an audit hook that records the files it creates, writes, renames or
deletes in a folder (`AUDITED`), so a test can check which process wrote what.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `python -m zoo ...` that also writes, at exit, every file event under the watched folder
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
# Gloo (the CPU collectives) prints "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number
# of connected peer ranks is : 3" in pieces, from several threads at once: lines can interleave.
GLOO_PIECES = re.compile(r"\[Gloo\]|Rank|is connected to|peer ranks\.|Expected number of "
                         r"connected peer ranks is :|\d+")  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def joined(processes: int = 2) -> list[str]:
    """The options that join `processes` processes (a fresh coordinator port); add --process-id."""
    return ["--coordinator", f"localhost:{free_port()}", "--num-processes", str(processes)]


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


def start(watched: Path, log: Path, devices: int, argv: list[str]) -> subprocess.Popen:
    """`python -m zoo *argv` on `devices` forced CPU devices; its file events under `watched`
    go to `log` (JSON) when it exits."""
    command = [sys.executable, "-c", AUDITED, str(watched), str(log), *argv]
    return subprocess.Popen(
        command, cwd=ROOT, env=environment(devices), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[str]:
    """Each process's output (stdout and stderr); on a failure or a hang, an assertion showing
    all of them without Gloo's connection messages."""
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


def silent(output: str) -> bool:
    """Whether a process printed nothing but Gloo's connection messages."""
    return GLOO_PIECES.sub("", output).split() == []


def last_json(output: str) -> dict:
    """The last line of `output` that holds a JSON object (what `--json` prints)."""
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


def file_events(log: Path) -> list[list[str]]:
    """The `[event, path]` pairs a process recorded (paths relative to the watched folder)."""
    return json.loads(log.read_text())


def in_shards(path: str) -> bool:
    """A path inside a checkpoint's orbax folder, where every process writes its shards."""
    parts = Path(path).parts
    return len(parts) >= 4 and parts[0] == "checkpoints" and parts[2].startswith("arrays")
