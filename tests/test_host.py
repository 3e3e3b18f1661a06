"""The host allocator setting: what the environment variable asks for, and that it is applied."""

from __future__ import annotations

import platform

import pytest

from zoo import host


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(host, "_applied", None)
    return monkeypatch


def test_requested_pad_reads_the_environment(fresh):
    fresh.delenv(host.ENV_VAR, raising=False)
    assert host.requested_top_pad_mb() == host.DEFAULT_TOP_PAD_MB
    fresh.setenv(host.ENV_VAR, "256")
    assert host.requested_top_pad_mb() == 256
    fresh.setenv(host.ENV_VAR, "lots")
    with pytest.raises(ValueError, match="whole number of MiB"):
        host.requested_top_pad_mb()
    fresh.setenv(host.ENV_VAR, "-5")
    with pytest.raises(ValueError, match=">= 0"):
        host.requested_top_pad_mb()


def test_zero_turns_it_off(fresh):
    fresh.setenv(host.ENV_VAR, "0")
    assert host.tune_host_allocator() is None
    assert host.allocator_note() == "system default malloc settings"


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)
def test_glibc_takes_the_pad_once(fresh):
    fresh.setenv(host.ENV_VAR, "64")
    assert host.tune_host_allocator() == 64
    fresh.setenv(host.ENV_VAR, "128")  # already applied in this process: unchanged
    assert host.tune_host_allocator() == 64
    assert "top pad and mmap threshold 64 MiB, trim threshold 128 MiB" in host.allocator_note()
