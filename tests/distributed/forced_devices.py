"""Run a snippet of Python in a fresh process that sees 8 forced CPU devices (the flag must be
set before JAX starts), from the checkout's root, and read the JSON it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_on_forced_devices(code: str, *, devices: int = 8, timeout: int = 400) -> Any:
    """The JSON value on the last line `code` prints, run with `devices` forced CPU devices.

    XLA's backend optimisations are off (compiling is most of the time here), and a device
    waiting for a collective on a loaded machine is given 240 s before XLA aborts it."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(
        [
            env.get("XLA_FLAGS", ""),
            f"--xla_force_host_platform_device_count={devices}",
            "--xla_backend_optimization_level=0",
            "--xla_cpu_collective_call_terminate_timeout_seconds=240",
        ]
    )
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
