"""The run directory of `zoo train`: `--out` checked before any work, the options a run was
started with (`train_args.json`), which `--resume` must repeat where they change the run, and
the tokenizer it was started with (`zoo_tokenizer.json`), which `--resume` reuses."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from zoo.data.tokenizers.base import TOKENIZER_FILE, Tokenizer, load_tokenizer
from zoo.files import read_json_object, write_text_atomic
from zoo.serialize import CONFIG_FILE, WEIGHTS_FILE

RUN_ARGS_FILE = "train_args.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the template a chat run renders with
# Options recorded at the start of a run (for the record and for --resume).
RECORDED = ("flavor", "preset", "init", "data", "seed", "schedule", "lr", "warmup",
            "weight_decay", "clip_norm", "batch_size", "max_len", "tokenizer", "chat_format",
            "train_on", "pack", "template", "messages_column", "role", "holdout",
            # preference runs: `zoo eval` scores with the run's own loss and reference
            "objective", "beta", "reference", "dpo_label_smoothing", "simpo_gamma",
            "max_prompt_len", "max_completion_len", "buckets", "loss_positions", "group_by_length")  # fmt: skip
# Options --resume must not change, and why (a record without one, from an older run, is not
# checked for it).
FIXED_ON_RESUME = {
    "seed": "the seed draws the data splits and the shuffling, so evaluation could overlap "
    "the examples the run already trained on",
    "schedule": "the learning rate would jump to another curve part way through the run",
    "lr": "the learning rate would jump part way through the run",
    "warmup": "the learning rate would jump to another curve part way through the run",
    "weight_decay": "the optimizer would change part way through the run",
    "clip_norm": "the optimizer would change part way through the run",
    "buckets": "the batches would be padded and grouped differently part way through the run",
    "group_by_length": "the batches would be drawn differently part way through the run",
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


def check_resume(args: argparse.Namespace, out: Path, step: int | None) -> None:
    """On `--resume` of a run whose newest checkpoint is at `step` (None: it has none), refuse
    `--steps` that would train nothing and options that differ from those it was started with
    (`out/train_args.json`; an older run without the file is not checked)."""
    if step is None or not args.resume:
        return
    finished = all((out / name).is_file() for name in (CONFIG_FILE, WEIGHTS_FILE))
    # --steps equal to the step finishes a run stopped before its final model was saved
    if args.steps < step or (args.steps == step and finished):
        raise ValueError(
            f"the run in {out} is at step {step}; --steps {args.steps} would train nothing: "
            f"pass --steps above {step} to train further"
        )
    path = out / RUN_ARGS_FILE
    if path.is_file():
        _compare(args, _recorded(args), path, out)


def run_buckets(args: argparse.Namespace, out: Path) -> str:
    """`--buckets` as the run uses it: as given, else "auto", except on `--resume` of a run
    recorded before the option existed (its `train_args.json` has no `buckets`), which padded to
    powers of two: "pow2", so its batches go on as they were."""
    if args.buckets is not None:
        return args.buckets
    return "pow2" if _recorded_without(args, out, "buckets") else "auto"


def run_group_by_length(args: argparse.Namespace, out: Path) -> bool:
    """`--group-by-length` as the run uses it: as given, else False, except on `--resume` of a
    run recorded before the option existed, which grouped its batches by length: True."""
    if args.group_by_length is not None:
        return bool(args.group_by_length)
    return _recorded_without(args, out, "group_by_length")


def run_loss_positions(args: argparse.Namespace, out: Path) -> bool:
    """Whether chat batches list the positions they score (`zoo.data.positions`): yes, but on
    `--resume` of a run recorded before they did, whose losses it then sums as it did."""
    return not _recorded_without(args, out, "loss_positions")


def _recorded_without(args: argparse.Namespace, out: Path, name: str) -> bool:
    """Whether this is a `--resume` of a run whose `train_args.json` has no `name`."""
    path = out / RUN_ARGS_FILE
    if not (getattr(args, "resume", False) and path.is_file()):
        return False
    return name not in read_json_object(path, fix="it records how the run was started")


def record_run(
    args: argparse.Namespace,
    out: Path,
    tokenizer: Tokenizer | None = None,
    *,
    chat_template: str | None = None,
    tokenizer_given: bool = True,
) -> None:
    """Record the options a run starts with in `out/train_args.json`, for `check_resume`, its
    full resolved config in `out/train_config.yaml`, for `zoo train --config` (see
    `zoo.cli._config_file`), its tokenizer in `out/zoo_tokenizer.json`, for
    `resumed_tokenizer`, and the chat template it renders conversations with in
    `out/chat_template.jinja`, for `zoo chat`, `zoo eval` and `zoo export`.

    Written by the run that holds `out` (`zoo.train.lock.RunLock`), once it has passed every
    check that could refuse it, and only when it starts without a checkpoint."""
    from zoo.cli._config_file import record_config

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / RUN_ARGS_FILE, json.dumps(_recorded(args), indent=2, sort_keys=True))
    record_config(out, args, tokenizer_given=tokenizer_given)
    if tokenizer is not None:
        tokenizer.save(out)
    if chat_template is not None:  # after the tokenizer's own, which it replaces
        write_text_atomic(out / CHAT_TEMPLATE_FILE, chat_template)


def resumed_tokenizer(args: argparse.Namespace, out: Path) -> Tokenizer | None:
    """On `--resume`, the tokenizer the run in `out` saved (`zoo_tokenizer.json`), which its
    embeddings were trained with; None where the tokenizer is not learnt from the data (an
    `--init` model's own, a synthetic task's, tiktoken). A learnt one (word, char) that the run
    did not save is refused: learnt again from data that may have changed, its ids could name
    other words."""
    specs = [args.data] if isinstance(args.data, str) else args.data
    if args.init is not None or all(spec.startswith("synthetic:") for spec in specs):
        return None
    if (out / TOKENIZER_FILE).is_file():
        return load_tokenizer(out)
    if str(args.tokenizer or "").startswith("tiktoken"):
        return None
    raise ValueError(
        f"--resume: the run in {out} saved no tokenizer ({TOKENIZER_FILE}), and a --tokenizer "
        f"{args.tokenizer or 'word'} vocabulary learnt again from --data {args.data} could give "
        "its ids other words; copy the run's zoo_tokenizer.json into it, or train into a new --out"
    )


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
