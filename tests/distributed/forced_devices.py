"""Run a snippet of Python in a fresh process that sees 8 forced CPU devices (the flag must be
set before JAX starts), from the checkout's root, and read the JSON it prints last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.distributed.launch import environment

ROOT = Path(__file__).resolve().parents[2]


def run_on_forced_devices(code: str, *, devices: int = 8, timeout: int = 400) -> Any:
    """The JSON value on the last line `code` prints, run with `devices` forced CPU devices.

    The environment is `launch.environment`'s: XLA's backend optimisations off, and 240 s for a
    device waiting on a collective on a loaded machine."""
    env = environment(devices)
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
