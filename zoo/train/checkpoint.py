"""Training checkpoints that lose nothing: model, optimizer state, step, RNG, data position.

A checkpoint is a directory `step_00000400/` inside the checkpoint directory
(`zoo.train.checkpoint_folder` says how it is named, completed, pruned and set aside):

- `model.safetensors`: the model's arrays, named by their path (as `zoo.save` names them); of a
  run that trains part of its model (LoRA, `--freeze`), the trained arrays only: the frozen rest
  is rebuilt on resume and recognised by its fingerprint (`zoo.train.frozen`)
- `optimizer.safetensors`: the optimizer state's arrays, named by their path in the state
- `state.json`: step, data position, RNG key, model flavor and config, anything extra, and the
  sha256 of each arrays file (`checksums`: a file changed after it was written is damaged)

A run on a mesh (`zoo.Trainer(mesh=...)`) writes both arrays files as one orbax folder
`arrays/` instead, each process its own shards (`zoo.train.sharded`); either kind loads onto a
mesh or one device.

No pickle: the optimizer state is rebuilt by filling `optimizer.init(params)` (a skeleton of
the right structure) with the saved arrays. A checkpoint damaged after it was written raises
`CorruptCheckpoint`; `load_newest_intact` then sets it aside and falls back to the newest
intact one.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray, PyTree

from zoo.distributed.hosts import all_processes_agree, is_writer
from zoo.distributed.layout import Layout
from zoo.files import save_safetensors
from zoo.models.config import TransformerConfig
from zoo.serialize import model_config_dict
from zoo.train.checkpoint_folder import (
    CHECKSUMS,
    CorruptCheckpoint,
    State,
    checkpoint_name,
    checkpoint_state,
    checksums,
    disk_error,
    latest_checkpoint,
    list_checkpoints,
    prune,
    publish,
    read_state,
    set_aside,
    staging_folder,
    state_arrays,
    verify_checksums,
    write_state,
)
from zoo.train.frozen import FROZEN, check_frozen, saved_arrays
from zoo.train.sharded import (
    ARRAYS_DIR,
    ShardedWriter,
    Targets,
    is_sharded_checkpoint,
    load_arrays,
)
from zoo.tree import Slot, fill, named_arrays

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"

__all__ = [
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "Checkpoint",
    "CorruptCheckpoint",
    "all_finite",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_newest_intact",
    "save_checkpoint",
    "state_arrays",
]


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model and optimizer state filled in, and the loop's position."""

    path: Path
    step: int  # optimizer updates done
    model: eqx.Module
    opt_state: PyTree
    key: PRNGKeyArray  # the run's base dropout key
    meta: State  # everything in state.json

    @property
    def data_position(self) -> int:
        """Index of the next batch to train on."""
        position = self.meta.get("data_position", self.step)
        return position if isinstance(position, int) else self.step


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    step: int,
    model: eqx.Module,
    opt_state: PyTree,
    key: PRNGKeyArray,
    extra: State | None = None,
    keep: int | None = 3,
    layout: Layout | None = None,
) -> Path:
    """Write checkpoint `step` atomically into `directory`, then keep only the newest `keep`.

    With a `layout` (training on a mesh) the arrays go to an orbax `arrays/` folder (every
    process calls this; see `zoo.train.sharded.ShardedWriter`, which can also write in the
    background).

    Args:
        directory: the checkpoint folder; the checkpoint is its `step_NNNNNNNN/`.
        step: optimizer updates done.
        model: the model, its arrays saved by their path.
        opt_state: the optimizer state, its arrays saved by their path in the state.
        key: the run's base dropout key.
        extra: more JSON-able settings for `state.json` (the trainer's: task, precision, ...).
        keep: how many checkpoints to keep, the newest (None: all).
        layout: the mesh the arrays are sharded on (None: one device).

    Where `extra` holds a `frozen` record (`zoo.train.frozen.frozen_extra`: the arrays the run
    does not train, by name and fingerprint), those arrays are left out of `model.safetensors`.
    """
    if layout is not None:
        with ShardedWriter(directory, keep=keep, background=False) as writer:
            return writer.save(step=step, model=model, opt_state=opt_state, key=key, extra=extra)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    staging = staging_folder(final)
    shutil.rmtree(staging, ignore_errors=True)  # left by a crash
    try:
        staging.mkdir()
        save_safetensors(_host_arrays(saved_arrays(model, extra)), staging / MODEL_FILE)
        save_safetensors(_host_arrays(state_arrays(opt_state)), staging / OPTIMIZER_FILE)
        sums = {CHECKSUMS: checksums(staging, (MODEL_FILE, OPTIMIZER_FILE))}
        write_state(staging, {**checkpoint_state(step, model, key, extra), **sums})
        publish(staging, final)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise disk_error(error, final) from None
        raise
    prune(directory, keep)
    return final


def _host_arrays(arrays: Mapping[str, Slot]) -> dict[str, np.ndarray]:
    tensors = {}
    for name, array in arrays.items():
        host = np.asarray(array)
        # safetensors.numpy has no bfloat16: store it widened (exact), narrowed when loading.
        if host.dtype == jnp.bfloat16:
            host = host.astype(np.float32)
        # (np.ascontiguousarray would turn the optimizer's 0-d step counts into 1-d arrays)
        tensors[name] = host.copy(order="C")
    return tensors


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: eqx.Module,
    opt_state: PyTree,
    layout: Layout | None = None,
) -> Checkpoint:
    """Read checkpoint `path`, filling the structures of `model` and `opt_state`.

    `model` must have the saved config (the same preset and overrides); `opt_state` is
    `optimizer.init(params)` of the same optimizer. Shapes and names are checked; files that
    cannot be read raise `CorruptCheckpoint`. With a `layout` the arrays land on its mesh
    (whatever mesh or device wrote them); without one, on one device.
    """
    path = Path(path)
    meta, step, saved_key = read_state(path)
    _check_config(path, meta, model)
    model_file, optimizer_file = path / MODEL_FILE, path / OPTIMIZER_FILE
    sharded = is_sharded_checkpoint(path)
    model_arrays: Mapping[str, jax.Array | np.ndarray]
    optimizer_arrays: Mapping[str, jax.Array | np.ndarray]
    if sharded:
        model_file = optimizer_file = path / ARRAYS_DIR
        arrays = load_arrays(path, _sharding_targets(model, opt_state, layout))
        model_arrays, optimizer_arrays = arrays["model"], arrays["optimizer"]
    else:
        model_arrays, optimizer_arrays = read_arrays(model_file), read_arrays(optimizer_file)
        verify_checksums(path, meta)  # files that parse, yet changed after they were written
    filled_model = _fill_model(path, meta, model, model_arrays, str(model_file))
    try:
        filled_state = fill(opt_state, optimizer_arrays, str(optimizer_file))
    except ValueError as error:
        raise ValueError(
            f"{error}. The optimizer state does not match: resume with the same optimizer "
            "settings (schedule, weight decay, clipping) as the saved run"
        ) from None
    if layout is not None and not sharded:
        filled_model, filled_state = layout.place(filled_model), layout.place(filled_state)
    return Checkpoint(
        path=path, step=step, model=filled_model, opt_state=filled_state, key=saved_key, meta=meta
    )


def _fill_model(
    path: Path,
    meta: State,
    model: eqx.Module,
    arrays: Mapping[str, jax.Array | np.ndarray],
    source: str,
) -> eqx.Module:
    """`model` with the saved arrays; a checkpoint of the trained arrays only keeps the frozen
    rest of `model`, once its fingerprint says it is the run's own (`zoo.train.frozen`)."""
    if FROZEN not in meta:
        return fill(model, arrays, source)
    frozen = set(check_frozen(path, meta[FROZEN], model))
    missing = sorted(set(named_arrays(model)) - frozen - set(arrays))
    if missing:
        raise CorruptCheckpoint(f"{Path(source).name} lacks the trained arrays {missing[:5]}")
    return fill(model, arrays, source, partial=True)


def _check_config(path: Path, meta: State, model: eqx.Module) -> None:
    """The checkpoint must hold a model of `model`'s flavor and config."""
    current = model_config_dict(model)
    recorded = meta.get("config")
    saved = _in_todays_fields(recorded if isinstance(recorded, dict) else {}, model)
    if meta.get("flavor") == current["flavor"] and saved == current["config"]:
        return
    differ = _differences(saved, current["config"])
    raise ValueError(
        f"checkpoint {path} holds a {meta.get('flavor')} whose config differs from this "
        f"{current['flavor']}'s in {differ or ['flavor']}; resume with the same preset "
        "and overrides, or train into a new directory"
    )


def _differences(saved: object, current: object, prefix: str = "") -> list[str]:
    """The dotted paths at which two configs' JSON forms differ (`layers.block.norm.eps`)."""
    if not (isinstance(saved, Mapping) and isinstance(current, Mapping)):
        return [] if saved == current else [prefix.rstrip(".") or "config"]
    return [
        path
        for name in sorted(set(saved) | set(current))
        for path in _differences(saved.get(name), current.get(name), f"{prefix}{name}.")
    ]


def _in_todays_fields(saved: Mapping[str, object], model: eqx.Module) -> Mapping[str, object]:
    """The config a checkpoint recorded, in the fields of today's config class: a run saved by
    an earlier zoo (0.1's flat config, `scan_layers` before `layer_loop`) resumes as
    `zoo.load` reads its model."""
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        return saved
    try:
        return type(config).from_dict(saved).to_dict()
    except (TypeError, ValueError):  # another flavor, or fields no version knew: told below
        return saved


def _sharding_targets(
    model: eqx.Module, opt_state: PyTree, layout: Layout | None
) -> Targets | None:
    """Where each saved array goes: its sharding by `layout`'s rules (None: one device)."""
    if layout is None:
        return None
    return {
        "model": layout.shardings(named_arrays(model)),
        "optimizer": layout.shardings(state_arrays(opt_state)),
    }


def read_arrays(path: Path) -> dict[str, np.ndarray]:
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
    found: list[tuple[int, Path]],
    *,
    model: eqx.Module,
    opt_state: PyTree,
    layout: Layout | None = None,
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
