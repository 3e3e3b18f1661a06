"""The checkpoint folder: how a checkpoint is named, completed, kept and set aside.

Both checkpoint writers follow it: the single-host one (`zoo.train.checkpoint`, safetensors
files) and the one of a run on a mesh (`zoo.train.sharded`, an orbax folder every process
writes its shards into).

- A checkpoint is a directory `step_00000400/` inside the checkpoint directory, holding
  `state.json` (step, data position, RNG key, model flavor and config, the run's settings) and
  the arrays, each named by its pytree path (`state_arrays`).
- It is written under a hidden name (`.step_00000400.partial/`), its files flushed to disk,
  then renamed into place (`publish`). Only a `step_*` directory holding `state.json` counts,
  so a crash mid-write never leaves a broken newest checkpoint.
- After each publish only the newest `keep` are kept, and hidden leftovers of a crash are
  removed (`prune`).
- `state.json` records the sha256 of each arrays file (`checksums`), checked when it is read.
- A checkpoint that turns out damaged (a truncated copy, a full disk during a sync, a file whose
  sha256 differs from the recorded one) raises
  `CorruptCheckpoint` when read; resuming renames it `step_*.corrupt` (`set_aside`), which no
  longer counts, and falls back to the newest intact one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray, PyTree

from zoo.files import JSONObject, read_json_object, sync_files
from zoo.serialize import model_config_dict
from zoo.train.spelling import resume_spelling
from zoo.tree import path_name

STATE_FILE = "state.json"
PREFIX = "step_"
STAGING_SUFFIX = ".partial"
CHECKSUMS = "checksums"  # state.json's `file name -> sha256` of the checkpoint's arrays files

# what `state.json` holds, as JSON values
State = JSONObject


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files cannot be read: truncated, missing or not what was written."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def staging_folder(final: Path) -> Path:
    """Where checkpoint `final` is written before it counts: `.step_00000400.partial` beside it
    (the same name in every process of a run on many, which all write into it)."""
    return final.with_name(f".{final.name}{STAGING_SUFFIX}")


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in `directory` as (step, path), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        digits = path.name[len(PREFIX) :]
        if path.name.startswith(PREFIX) and digits.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(digits), path))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `directory`, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def state_arrays(tree: PyTree) -> dict[str, jax.Array]:
    """Every array leaf of a pytree (a model, an optimizer state) keyed by its path."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {path_name(path): leaf for path, leaf in flat if eqx.is_array(leaf)}


def checkpoint_state(step: int, model: eqx.Module, key: PRNGKeyArray, extra: State | None) -> State:
    """What `state.json` holds: step, data position, RNG key, model config, `extra`."""
    return {
        "step": step,
        "data_position": step,
        "key": _key_to_json(key),
        **model_config_dict(model),
        **(extra or {}),
    }


def write_state(staging: Path, state: Mapping[str, object]) -> None:
    (staging / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def read_state(path: Path) -> tuple[State, int, PRNGKeyArray]:
    """`(state, step, key)` of checkpoint `path`; `CorruptCheckpoint` when unreadable."""
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    try:
        state = read_json_object(state_file, fix="the run resumes from an older checkpoint")
        step, key = state["step"], state["key"]
        if not isinstance(step, int | float | str) or not isinstance(key, dict):
            kinds = f"{type(step).__name__} and {type(key).__name__}"
            raise TypeError(f"'step' and 'key' are {kinds}, not a number and an object")
        return state, int(step), _key_from_json(key)
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptCheckpoint(f"{STATE_FILE} is unreadable ({error!r})") from None


def checksums(folder: Path, names: tuple[str, ...]) -> dict[str, str]:
    """`name -> sha256` (hex) of the files `names` in `folder`, for `state.json`."""
    return {name: _sha256(folder / name) for name in names}


def verify_checksums(path: Path, state: State) -> None:
    """Raise `CorruptCheckpoint` when a file of checkpoint `path` differs from the sha256 its
    `state.json` recorded (a checkpoint written before checksums has none: not checked)."""
    recorded = state.get(CHECKSUMS) or {}
    if not isinstance(recorded, dict):
        raise CorruptCheckpoint(f"{STATE_FILE} holds no valid {CHECKSUMS}")
    for name, expected in recorded.items():
        file = path / Path(str(name)).name  # a name, never a path out of the checkpoint
        if not file.is_file():
            raise CorruptCheckpoint(f"{name} is missing")
        if _sha256(file) != expected:
            raise CorruptCheckpoint(
                f"{name} does not match the sha256 recorded when it was written"
            )


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _key_to_json(key: PRNGKeyArray) -> JSONObject:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(key)
        return {"impl": str(jax.random.key_impl(key)), "data": np.asarray(data).tolist()}
    return {"impl": None, "data": np.asarray(key).tolist()}


def _key_from_json(saved: JSONObject) -> PRNGKeyArray:
    data = jnp.asarray(np.asarray(saved["data"], dtype=np.uint32))
    impl = saved["impl"]
    if impl is None:
        return data
    if not isinstance(impl, str):
        raise ValueError(f"a saved random key's impl must be a name, got {impl!r}")
    return jax.random.wrap_key_data(data, impl=impl)


def publish(staging: Path, final: Path) -> None:
    """Flush `staging` to disk and rename it to `final`: the checkpoint now counts."""
    sync_files(staging)  # orbax's arrays/ (a folder) syncs its own files
    if final.exists():  # the same step saved again (e.g. an interrupted final save)
        shutil.rmtree(final)
    os.replace(staging, final)


def disk_error(error: OSError, final: Path) -> OSError:
    """A failed write (e.g. a full disk): what was lost, what is kept, what to do."""
    kept = latest_checkpoint(final.parent)
    reason = os.strerror(error.errno) if error.errno else str(error)  # not the staging path
    return OSError(
        error.errno,
        f"could not write checkpoint {final} ({reason}); the newest "
        f"intact checkpoint is {kept or 'none'}. Free some disk space (or keep fewer "
        f"checkpoints) and continue with {resume_spelling()}",
    )


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `step_*.corrupt` so it no longer counts (nor is pruned)."""
    target = path.with_name(f"{path.name}.corrupt")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.corrupt{number}")
    os.replace(path, target)
    return target


def prune(directory: Path, keep: int | None) -> None:
    """Remove hidden staging directories and all but the newest `keep` checkpoints."""
    for entry in directory.iterdir():  # staging directories left behind by a crash
        if entry.name.startswith(f".{PREFIX}") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
    if keep is None:
        return
    for _, path in list_checkpoints(directory)[: -max(keep, 1)]:
        shutil.rmtree(path, ignore_errors=True)
