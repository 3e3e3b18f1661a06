"""The run directory of `zoo train`: `--out` checked before any work, and the options a run was
started with (`train_args.json`), which `--resume` must repeat where they change the run."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from zoo.files import read_json_object, write_text_atomic

RUN_ARGS_FILE = "train_args.json"
# Options recorded at the start of a run (for the record and for --resume).
RECORDED = ("flavor", "preset", "init", "data", "seed", "schedule", "lr", "warmup",
            "weight_decay", "batch_size", "max_len", "tokenizer")  # fmt: skip
# Options --resume must not change, and why.
FIXED_ON_RESUME = {
    "seed": "the seed draws the data splits and the shuffling, so evaluation could overlap "
    "the examples the run already trained on",
    "schedule": "the learning rate would jump to another curve part way through the run",
}


def check_out_dir(text: str) -> Path:
    """`--out` as a path, refused when it is empty, a file, under a file or not writable.

    Nothing is created here: the first write (a checkpoint or the record) makes the folders.
    """
    if not text.strip():
        raise ValueError(
            "--out is empty; name the run directory (e.g. --out runs/first), it holds "
            "checkpoints, metrics.jsonl and the final model"
        )
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {text} is a file, not a directory; choose a directory name")
    ancestor = next(parent for parent in (path, *path.parents) if parent.exists())
    if not ancestor.is_dir():
        raise ValueError(
            f"--out {text} lies under {ancestor}, which is a file; choose a directory name"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(
            f"--out {text}: {ancestor} is not writable (read-only or not yours); choose a "
            "directory you can write to"
        )
    return path


def check_resume(args: argparse.Namespace, out: Path, has_checkpoint: bool) -> None:
    """On `--resume` of a run with a checkpoint, refuse options that differ from those it was
    started with (`out/train_args.json`; an older run without the file is not checked)."""
    path = out / RUN_ARGS_FILE
    if has_checkpoint and args.resume and path.is_file():
        _compare(args, _recorded(args), path, out)


def record_run(args: argparse.Namespace, out: Path) -> None:
    """Record the options a run starts with in `out/train_args.json`, for `check_resume`.

    Written by the run that holds `out` (`zoo.train.lock.RunLock`), once it has passed every
    check that could refuse it, and only when it starts without a checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / RUN_ARGS_FILE, json.dumps(_recorded(args), indent=2, sort_keys=True))


def _recorded(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name, None) for name in RECORDED}


def _compare(args: argparse.Namespace, current: dict[str, Any], path: Path, out: Path) -> None:
    fix = "it records how the run was started: delete it to resume without the check"
    saved = read_json_object(path, fix=fix)
    for name, why in FIXED_ON_RESUME.items():
        if name in saved and saved[name] != current[name]:
            option = "--" + name.replace("_", "-")
            raise ValueError(
                f"--resume with {option} {current[name]}, but the run in {out} was started with "
                f"{option} {saved[name]} ({path}): {why}; resume with {option} {saved[name]}, "
                "or train into a new --out"
            )
