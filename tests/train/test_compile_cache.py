"""`zoo train --compile-cache DIR`: a second run of the same command reads its compiled programs
from DIR instead of compiling them (two processes, as a user reruns a command)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from zoo.train.compile_cache import OFF, cache_entries, default_directory, enable_compile_cache

COMMAND = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition", "--steps",
           "1", "--batch-size", "4", "--eval-limit", "1", "--no-progress", "--json"]  # fmt: skip


def run_zoo(args: list[str]) -> str:
    # every program is cached, however fast it compiled: on a quiet machine the tiny model's
    # programs compile in less than zoo's 0.2 s threshold
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # fmt: skip
    code = "import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stderr


def test_a_second_run_reads_every_program_the_first_wrote(tmp_path):
    cache = tmp_path / "cache"
    run_zoo([*COMMAND, "--out", str(tmp_path / "a"), "--compile-cache", str(cache)])
    written = {path.name.removesuffix("-cache") for path in cache.glob("*-cache")}
    assert len(written) == cache_entries(cache) > 0
    second = run_zoo([*COMMAND, "--out", str(tmp_path / "b"), "--compile-cache", str(cache)])
    # an entry is the file KEY-cache; JAX logs the key of each program it reads back (a program
    # the first run compiled twice, for two functions of one computation, was a hit there too)
    hits = re.findall(r"Persistent compilation cache hit for '[^']+' with key '([^']+)'", second)
    assert set(hits) == written
    assert cache_entries(cache) == len(written)  # nothing new to compile
    # the train and eval steps are among them: they check the batches on the host, so their
    # programs hold no host callback (which JAX would not cache)
    for step in ("jit_train_step", "jit_eval_step"):
        assert any(name.startswith(f"{step}-") for name in written), sorted(written)


def test_none_turns_it_off_and_the_default_follows_the_environment(monkeypatch, tmp_path):
    assert enable_compile_cache(OFF) is None
    assert enable_compile_cache(None) is None
    monkeypatch.setenv("ZOO_COMPILE_CACHE", str(tmp_path / "mine"))
    assert default_directory() == str(tmp_path / "mine")
    monkeypatch.delenv("ZOO_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == os.path.join(str(tmp_path / "xdg"), "zoo", "compile")


def test_an_unwritable_folder_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.setattr("zoo.train.compile_cache._enabled", None)  # no folder opened yet
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="--compile-cache .*cannot create the folder"):
        enable_compile_cache(blocker / "cache")
