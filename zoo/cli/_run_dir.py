"""The run directory of `zoo train`: `--out` checked before any work, the options a run was
started with (`train_args.json`), which `--resume` must repeat where they change the run, and
the tokenizer it was started with (`zoo_tokenizer.json`), which `--resume` reuses.

A run's options are its flags as data (`RunFlags`: every option by its name, the preset's
defaults filled in), which `zoo train` takes from its command line once; `train_args.json`
holds those of `RECORDED`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from zoo.cli._config_file import FlagValue, RunFlags
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
            "max_prompt_len", "max_completion_len", "buckets", "loss_positions", "group_by_length",
            "center_rewards_coefficient")  # fmt: skip
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


def check_resume(flags: RunFlags, out: Path, step: int | None, *, steps: int, resume: bool) -> None:
    """On `--resume` of a run whose newest checkpoint is at `step` (None: it has none), refuse
    `--steps` that would train nothing and options (of `flags`) that differ from those it was
    started with (`out/train_args.json`; an older run without the file is not checked)."""
    if step is None or not resume:
        return
    finished = all((out / name).is_file() for name in (CONFIG_FILE, WEIGHTS_FILE))
    # --steps equal to the step finishes a run stopped before its final model was saved
    if steps < step or (steps == step and finished):
        epochs = flags.get("epochs")
        asked, more = (f"--epochs {epochs} ({steps} steps)", "more --epochs") if epochs else (
            f"--steps {steps}", f"--steps above {step}")  # fmt: skip
        raise ValueError(
            f"the run in {out} is at step {step}; {asked} would train nothing: pass {more} to "
            "train further"
        )
    path = out / RUN_ARGS_FILE
    if path.is_file():
        _compare(_recorded(flags), path, out)


def run_buckets(given: str | None, out: Path, *, resume: bool) -> str:
    """`--buckets` as the run uses it: as `given`, else "auto", except on `--resume` of a run
    recorded before the option existed (its `train_args.json` has no `buckets`), which padded to
    powers of two: "pow2", so its batches go on as they were."""
    if given is not None:
        return given
    return "pow2" if _recorded_without(out, "buckets", resume=resume) else "auto"


def run_group_by_length(given: bool | None, out: Path, *, resume: bool) -> bool:
    """`--group-by-length` as the run uses it: as `given`, else False, except on `--resume` of
    a run recorded before the option existed, which grouped its batches by length: True."""
    if given is not None:
        return given
    return _recorded_without(out, "group_by_length", resume=resume)


def run_loss_positions(out: Path, *, resume: bool) -> bool:
    """Whether chat batches list the positions they score (`zoo.data.positions`): yes, but on
    `--resume` of a run recorded before they did, whose losses it then sums as it did."""
    return not _recorded_without(out, "loss_positions", resume=resume)


def _recorded_without(out: Path, name: str, *, resume: bool) -> bool:
    """Whether this is a `--resume` of a run whose `train_args.json` has no `name`."""
    path = out / RUN_ARGS_FILE
    if not (resume and path.is_file()):
        return False
    return name not in read_json_object(path, fix="it records how the run was started")


def record_run(
    flags: RunFlags,
    out: Path,
    tokenizer: Tokenizer | None = None,
    *,
    chat_template: str | None = None,
    tokenizer_given: bool = True,
) -> None:
    """Record the options (of `flags`) a run starts with in `out/train_args.json`, for
    `check_resume`, its
    full resolved config in `out/train_config.yaml`, for `zoo train --config` (see
    `zoo.cli._config_file`), its tokenizer in `out/zoo_tokenizer.json`, for
    `resumed_tokenizer`, and the chat template it renders conversations with in
    `out/chat_template.jinja`, for `zoo chat`, `zoo eval` and `zoo export`.

    Written by the run that holds `out` (`zoo.train.lock.RunLock`), once it has passed every
    check that could refuse it, and only when it starts without a checkpoint."""
    from zoo.cli._config_file import record_config

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / RUN_ARGS_FILE, json.dumps(_recorded(flags), indent=2, sort_keys=True))
    record_config(out, flags, tokenizer_given=tokenizer_given)
    if tokenizer is not None:
        tokenizer.save(out)
    if chat_template is not None:  # after the tokenizer's own, which it replaces
        write_text_atomic(out / CHAT_TEMPLATE_FILE, chat_template)


def resumed_tokenizer(
    out: Path, *, data: str | Sequence[str], init: str | None, tokenizer: str | None
) -> Tokenizer | None:
    """On `--resume`, the tokenizer the run in `out` saved (`zoo_tokenizer.json`), which its
    embeddings were trained with; None where the tokenizer is not learnt from the data (an
    `--init` model's own, a synthetic task's, tiktoken). A learnt one (word, char) that the run
    did not save is refused: learnt again from data that may have changed, its ids could name
    other words. `data`, `init` and `tokenizer` are the run's `--data`, `--init` and
    `--tokenizer`."""
    specs = [data] if isinstance(data, str) else data
    if init is not None or all(spec.startswith("synthetic:") for spec in specs):
        return None
    if (out / TOKENIZER_FILE).is_file():
        return load_tokenizer(out)
    if str(tokenizer or "").startswith("tiktoken"):
        return None
    shown = data if isinstance(data, str) else list(data)
    raise ValueError(
        f"--resume: the run in {out} saved no tokenizer ({TOKENIZER_FILE}), and a --tokenizer "
        f"{tokenizer or 'word'} vocabulary learnt again from --data {shown} could give "
        "its ids other words; copy the run's zoo_tokenizer.json into it, or train into a new --out"
    )


def recorded_str(record: Mapping[str, object], name: str) -> str | None:
    """The text option `name` of a run's `record` (its `train_args.json`); None when missing."""
    value = record.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(_not_recorded_as(name, value, "text"))


def recorded_float(record: Mapping[str, object], name: str) -> float | None:
    """The number option `name` of a run's `record` (its `train_args.json`); None when missing."""
    value = record.get(name)
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ValueError(_not_recorded_as(name, value, "a number"))


def recorded_int(record: Mapping[str, object], name: str) -> int | None:
    """The whole-number option `name` of a run's `record` (its `train_args.json`); None when
    missing."""
    value = record.get(name)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(_not_recorded_as(name, value, "a whole number"))


def _not_recorded_as(name: str, value: object, kind: str) -> str:
    return (
        f"the run's {RUN_ARGS_FILE} records {name} {value!r}, which is not {kind}; correct it "
        "(it records how the run was started)"
    )


def _recorded(flags: RunFlags) -> dict[str, FlagValue]:
    return {name: flags.get(name) for name in RECORDED}


def _compare(current: dict[str, FlagValue], path: Path, out: Path) -> None:
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
