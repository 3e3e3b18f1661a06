"""Runs tests/distributed/forced/ in its own pytest process on 8 forced host (CPU) devices.

JAX fixes its device count when it starts, so 8 devices need `XLA_FLAGS` set before that: in a
subprocess. One process for all the checks keeps the compile time (the bulk of it) shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed
pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_forced_device_suite_passes():
    env = dict(os.environ)
    # 8 CPU devices; XLA's backend optimisations off: compiling is most of the time here. The
    # 8 devices are threads sharing the machine's cores: on a loaded machine one may wait long
    # to join a collective, which XLA otherwise aborts after 40 s.
    env["XLA_FLAGS"] = " ".join(
        [
            env.get("XLA_FLAGS", ""),
            "--xla_force_host_platform_device_count=8",
            "--xla_backend_optimization_level=0",
            "--xla_cpu_collective_call_terminate_timeout_seconds=240",
            "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120",
        ]
    )
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-rs", str(ROOT / "tests/distributed/forced")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert " skipped" not in output.splitlines()[-1], output[-3000:]
