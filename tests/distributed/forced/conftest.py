"""These tests need 8 host devices, which JAX only makes when XLA_FLAGS asks before it starts:
tests/distributed/test_forced_devices.py runs them in a separate pytest process."""

from __future__ import annotations

import jax
import pytest

DEVICES = 8


def pytest_collection_modifyitems(config, items):
    if jax.device_count() == DEVICES:
        return
    skip = pytest.mark.skip(
        reason=f"needs {DEVICES} devices (XLA_FLAGS=--xla_force_host_platform_device_count="
        f"{DEVICES}); tests/distributed/test_forced_devices.py runs these in a subprocess"
    )
    for item in items:
        if "distributed/forced" in str(item.fspath):
            item.add_marker(skip)
