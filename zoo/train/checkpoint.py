"""Training checkpoints that lose nothing: model, optimizer state, step, RNG, data position.

A checkpoint is a directory `step_00000400/` inside the checkpoint directory:

- `model.safetensors`: the model's arrays, named by their path (as `zoo.save` names them)
- `optimizer.safetensors`: the optimizer state's arrays, named by their path in the state
- `state.json`: step, data position, RNG key, model flavor and config, anything extra

A run on a mesh (`zoo.Trainer(mesh=...)`) writes both arrays files as one orbax folder
`arrays/` instead, each process its own shards (`zoo.distributed.checkpoint`); either kind
loads onto a mesh or one device.

No pickle: the optimizer state is rebuilt by filling `optimizer.init(params)` (a skeleton of
the right structure) with the saved arrays. Writing goes to a hidden temporary directory that
is renamed into place only when complete, so a crash mid-write never leaves a broken newest
checkpoint; only complete `step_*` directories count. A checkpoint damaged later (a truncated
copy, a full disk during a sync) raises `CorruptCheckpoint`; resuming then sets it aside as
`step_*.corrupt` and falls back to the newest intact one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from zoo.serialize import model_config_dict
from zoo.tree import fill, named_arrays, path_name

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
ARRAYS_DIR = "arrays"  # a run on a mesh: model and optimizer arrays, written by orbax
PREFIX = "step_"


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files cannot be read: truncated, missing or not what was written."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model and optimizer state filled in, and the loop's position."""

    path: Path
    step: int  # optimizer updates done
    model: Any
    opt_state: Any
    key: PRNGKeyArray  # the run's base dropout key
    meta: dict[str, Any]  # everything in state.json

    @property
    def data_position(self) -> int:
        """Index of the next batch to train on."""
        return int(self.meta.get("data_position", self.step))


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


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


def state_arrays(tree: Any) -> dict[str, Any]:
    """Every array leaf of a pytree (e.g. an optimizer state) keyed by its path."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {path_name(path): leaf for path, leaf in flat if eqx.is_array(leaf)}


def fill_state(skeleton: Any, tensors: Mapping[str, np.ndarray | jax.Array], source: str) -> Any:
    """`skeleton` (e.g. `optimizer.init(params)`) with its arrays replaced by `tensors`."""
    expected = state_arrays(skeleton)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing arrays {missing}, unexpected arrays {unexpected}")
    replaced = {}
    for name, slot in expected.items():
        value = tensors[name]
        if tuple(value.shape) != tuple(slot.shape):
            raise ValueError(
                f"{source}: array {name!r} has shape {tuple(value.shape)}, expected "
                f"{tuple(slot.shape)}"
            )
        replaced[name] = jnp.asarray(value, dtype=slot.dtype)
    flat, treedef = jax.tree_util.tree_flatten_with_path(skeleton)
    return jax.tree_util.tree_unflatten(
        treedef, [replaced.get(path_name(path), leaf) for path, leaf in flat]
    )


def _host_arrays(arrays: dict[str, Any]) -> dict[str, np.ndarray]:
    tensors = {}
    for name, array in arrays.items():
        # numpy has no bfloat16: store it widened (exact) and narrow it again when loading.
        if array.dtype == jnp.bfloat16:
            array = array.astype(jnp.float32)
        # (np.ascontiguousarray would turn the optimizer's 0-d step counts into 1-d arrays)
        tensors[name] = np.asarray(array).copy(order="C")
    return tensors


def _key_to_json(key: PRNGKeyArray) -> dict[str, Any]:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(key)
        return {"impl": str(jax.random.key_impl(key)), "data": np.asarray(data).tolist()}
    return {"impl": None, "data": np.asarray(key).tolist()}


def _key_from_json(saved: dict[str, Any]) -> PRNGKeyArray:
    data = jnp.asarray(np.asarray(saved["data"], dtype=np.uint32))
    if saved["impl"] is None:
        return data
    return jax.random.wrap_key_data(data, impl=saved["impl"])


def _sync_files(directory: Path) -> None:
    """Flush the directory's files to disk before it is published under its final name."""
    for path in directory.iterdir():
        if path.is_dir():  # orbax's arrays/: it syncs its own files
            continue
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    step: int,
    model: eqx.Module,
    opt_state: Any,
    key: PRNGKeyArray,
    extra: dict[str, Any] | None = None,
    keep: int | None = 3,
    layout: Any = None,
) -> Path:
    """Write checkpoint `step` atomically into `directory`, then keep only the newest `keep`.

    With a `layout` (training on a mesh) the arrays go to an orbax `arrays/` folder (every
    process calls this; see `zoo.distributed.checkpoint.ShardedWriter`, which can also write
    in the background)."""
    if layout is not None:
        from zoo.distributed.checkpoint import ShardedWriter

        with ShardedWriter(directory, keep=keep, background=False) as writer:
            return writer.save(step=step, model=model, opt_state=opt_state, key=key, extra=extra)
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=f".{final.name}."))
    try:
        save_file(_host_arrays(named_arrays(model)), str(staging / MODEL_FILE))
        save_file(_host_arrays(state_arrays(opt_state)), str(staging / OPTIMIZER_FILE))
        write_state(staging, checkpoint_state(step, model, key, extra))
        publish(staging, final)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise disk_error(error, final) from None
        raise
    prune(directory, keep)
    return final


def checkpoint_state(
    step: int, model: eqx.Module, key: PRNGKeyArray, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """What `state.json` holds: step, data position, RNG key, model config, `extra`."""
    return {
        "step": step,
        "data_position": step,
        "key": _key_to_json(key),
        **model_config_dict(model),
        **(extra or {}),
    }


def write_state(staging: Path, state: dict[str, Any]) -> None:
    (staging / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def publish(staging: Path, final: Path) -> None:
    """Flush `staging` to disk and rename it to `final`: the checkpoint now counts."""
    _sync_files(staging)
    if final.exists():  # the same step saved again (e.g. an interrupted final save)
        shutil.rmtree(final)
    os.replace(staging, final)


def disk_error(error: OSError, final: Path) -> OSError:
    """A failed write (e.g. a full disk): what was lost, what is kept, what to do."""
    kept = latest_checkpoint(final.parent)
    return OSError(
        error.errno,
        f"could not write checkpoint {final} ({error.strerror or error}); the newest "
        f"intact checkpoint is {kept or 'none'}. Free some disk space (or keep fewer "
        "checkpoints) and continue with resume=True (zoo train --resume)",
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


def load_checkpoint(
    path: str | os.PathLike, *, model: eqx.Module, opt_state: Any, layout: Any = None
) -> Checkpoint:
    """Read checkpoint `path`, filling the structures of `model` and `opt_state`.

    `model` must have the saved config (the same preset and overrides); `opt_state` is
    `optimizer.init(params)` of the same optimizer. Shapes and names are checked; files that
    cannot be read raise `CorruptCheckpoint`. With a `layout` the arrays land on its mesh
    (whatever mesh or device wrote them); without one, on one device.
    """
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    try:
        meta = json.loads(state_file.read_text(encoding="utf-8"))
        step, saved_key = int(meta["step"]), _key_from_json(meta["key"])
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptCheckpoint(f"{STATE_FILE} is unreadable ({error!r})") from None
    current = model_config_dict(model)
    saved = _in_todays_fields(meta.get("config") or {}, model)
    if meta.get("flavor") != current["flavor"] or saved != current["config"]:
        differ = sorted(
            name
            for name in set(saved) | set(current["config"])
            if saved.get(name) != current["config"].get(name)
        )
        raise ValueError(
            f"checkpoint {path} holds a {meta.get('flavor')} whose config differs from this "
            f"{current['flavor']}'s in {differ or ['flavor']}; resume with the same preset "
            "and overrides, or train into a new directory"
        )
    model_file, optimizer_file = path / MODEL_FILE, path / OPTIMIZER_FILE
    if is_sharded_checkpoint(path):
        from zoo.distributed.checkpoint import load_arrays

        model_file = optimizer_file = path / ARRAYS_DIR
        arrays = load_arrays(path, _sharding_targets(model, opt_state, layout))
        model_arrays, optimizer_arrays = arrays["model"], arrays["optimizer"]
    else:
        model_arrays, optimizer_arrays = _read_arrays(model_file), _read_arrays(optimizer_file)
    filled_model = fill(model, model_arrays, str(model_file))
    try:
        filled_state = fill_state(opt_state, optimizer_arrays, str(optimizer_file))
    except ValueError as error:
        raise ValueError(
            f"{error}. The optimizer state does not match: resume with the same optimizer "
            "settings (schedule, weight decay, clipping) as the saved run"
        ) from None
    if layout is not None and not is_sharded_checkpoint(path):
        filled_model, filled_state = layout.place(filled_model), layout.place(filled_state)
    return Checkpoint(
        path=path, step=step, model=filled_model, opt_state=filled_state, key=saved_key, meta=meta
    )


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether checkpoint `path` was written on a mesh (an orbax `arrays/` folder)."""
    return (path / ARRAYS_DIR).is_dir()


def _sharding_targets(model: eqx.Module, opt_state: Any, layout: Any) -> dict[str, Any] | None:
    """Where each saved array goes: its sharding by `layout`'s rules (None: one device)."""
    if layout is None:
        return None
    return {
        "model": layout.shardings(named_arrays(model)),
        "optimizer": layout.shardings(state_arrays(opt_state)),
    }


def _in_todays_fields(saved: dict[str, Any], model: eqx.Module) -> dict[str, Any]:
    """The config a checkpoint recorded, in the fields of today's config class: a run saved by
    an earlier zoo (`scan_layers` before `layer_loop`) resumes as `zoo.load` reads its model."""
    try:
        return type(model.config).from_dict(saved).to_dict()  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # another flavor, or fields no version knew: told below
        return saved


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise CorruptCheckpoint(f"{path.name} is unreadable ({error})") from None


def all_finite(model: eqx.Module) -> bool:
    """Whether every floating-point weight of `model` is finite (one host sync).

    Weights spread over several devices are checked on the host from their shards: no
    cross-device reduction is launched (many small collectives can stall CPU devices).
    """
    leaves = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))
    if any(isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) > 1 for leaf in leaves):
        from zoo.distributed.hosts import all_processes_agree

        finite = all(
            bool(np.isfinite(np.asarray(shard.data, np.float32)).all())
            for leaf in leaves
            for shard in leaf.addressable_shards
        )
        return all_processes_agree(finite)  # each process sees only its own shards
    return bool(_finite_on_device(leaves))


@jax.jit
def _finite_on_device(leaves: list[jax.Array]) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def load_newest_intact(
    found: list[tuple[int, Path]], *, model: eqx.Module, opt_state: Any, layout: Any = None
) -> Checkpoint:
    """The newest of `found` (from `list_checkpoints`) that reads whole with finite weights.

    Each damaged one is set aside (`set_aside`) with a warning that says why; a ValueError when
    none is intact. A config or optimizer mismatch is not damage: it raises at once.
    """
    skipped = []
    for _, path in reversed(found):
        try:
            saved = load_checkpoint(path, model=model, opt_state=opt_state, layout=layout)
            if not all_finite(saved.model):
                raise CorruptCheckpoint("its weights are not finite (NaN or inf)")
        except CorruptCheckpoint as error:
            from zoo.distributed.hosts import is_writer

            skipped.append(f"{path.name}: {error}")
            if is_writer():  # with many processes, process 0 moves it for all
                aside = set_aside(path)
                warnings.warn(
                    f"skipped checkpoint {path.name}: {error}; moved it to {aside.name}",
                    stacklevel=5,
                )
            continue
        return saved
    raise ValueError(
        f"no intact checkpoint in {found[0][1].parent} (set aside as *.corrupt: "
        f"{'; '.join(skipped)}); start a new run in another directory"
    )
