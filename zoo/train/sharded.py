"""Checkpoints of a run on a mesh: orbax-checkpoint writes the shards each process holds.

Such a checkpoint follows the same folder protocol as any (`zoo.train.checkpoint_folder`:
names, `state.json`, a hidden folder published by rename, pruning) and holds, instead of
`model.safetensors` + `optimizer.safetensors`, a folder `arrays/` written by orbax:
`{"model": {path: array}, "optimizer": {path: array}}`, each array named by its pytree path.
Restoring reads each array straight onto the sharding asked for, so a checkpoint moves between
meshes (fsdp=8 -> data=2,tensor=4) and onto one device.

`ShardedWriter` writes them: every process hands orbax its shards, which are copied to host
memory before `save` returns and written to disk in the background while training goes on;
process 0 writes `state.json` and, once every process's shards are on disk, publishes the
checkpoint (`zoo.train.pending`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray, PyTree

from zoo.distributed.hosts import is_writer
from zoo.extras import pip_install
from zoo.train.checkpoint_folder import (
    CorruptCheckpoint,
    State,
    checkpoint_name,
    checkpoint_state,
    disk_error,
    prune,
    publish,
    staging_folder,
    state_arrays,
    write_state,
)
from zoo.train.frozen import saved_arrays
from zoo.train.pending import PendingWrite

ARRAYS_DIR = "arrays"  # the model's and the optimizer's arrays, written by orbax
# array name -> where it goes (a sharding), for "model" and "optimizer"
Targets = dict[str, dict[str, jax.sharding.Sharding]]


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether checkpoint `path` was written on a mesh (an orbax `arrays/` folder)."""
    return (path / ARRAYS_DIR).is_dir()


def require_orbax() -> ModuleType:
    """The `orbax.checkpoint` module, or an ImportError that names the extra to install."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(
            "training on a mesh writes sharded checkpoints with orbax-checkpoint, which is not "
            f"installed: {pip_install('distributed')}"
        ) from None
    return ocp


class ShardedWriter:
    """Writes mesh checkpoints into `directory`, one at a time, keeping the newest `keep`.

    Every process calls `save` with the same step. With `background=True` it returns once the
    arrays are in host memory; the write finishes in the background and the checkpoint is
    published (renamed into place, counted for `keep`) only when complete. `wait_published`
    waits for it and raises a failure (`CheckpointWriteFailed`); the next `save` and `close`
    wait first."""

    def __init__(self, directory: str | os.PathLike, *, keep: int | None, background: bool = True):
        ocp = require_orbax()
        self.directory = Path(directory).absolute()  # orbax takes absolute paths only
        self.keep = keep
        self.background = background
        self.pending: PendingWrite | None = None
        self._checkpointer = ocp.StandardCheckpointer()  # asynchronous: it writes in threads

    def save(
        self,
        *,
        step: int,
        model: eqx.Module,
        opt_state: PyTree,
        key: PRNGKeyArray,
        extra: State | None = None,
    ) -> Path:
        """Start writing checkpoint `step`; returns the path it will have once published.
        The frozen arrays `extra` names are left out (`zoo.train.checkpoint.save_checkpoint`)."""

        self.wait_published()
        final = self.directory / checkpoint_name(step)
        # the same name on every process: they all write into it (orbax first waits for all)
        staging = staging_folder(final)
        if is_writer():
            shutil.rmtree(staging, ignore_errors=True)  # left by a crash
            try:
                staging.mkdir(parents=True)
                write_state(staging, checkpoint_state(step, model, key, extra))
            except OSError as error:
                shutil.rmtree(staging, ignore_errors=True)
                raise disk_error(error, final) from None
        arrays = {"model": saved_arrays(model, extra), "optimizer": state_arrays(opt_state)}
        self._checkpointer.save(staging / ARRAYS_DIR, arrays)
        self.pending = PendingWrite(final, lambda: self._finish(staging, final))
        if not self.background:
            self.wait_published()
        return final

    def _finish(self, staging: Path, final: Path) -> Path:
        """In the background: wait until every process's shards are on disk, then publish."""
        try:
            self._wait_for_arrays()
            if is_writer():
                publish(staging, final)
                prune(self.directory, self.keep)
        except BaseException as error:
            if is_writer():
                shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, OSError):
                raise disk_error(error, final) from error
            raise
        return final

    def _wait_for_arrays(self) -> None:
        """Until orbax has every process's shards on disk (it synchronises the processes)."""
        self._checkpointer.wait_until_finished()

    def wait_published(self) -> Path | None:
        """Wait for the checkpoint being written; its path (None if there was none)."""
        pending, self.pending = self.pending, None
        return None if pending is None else pending.wait()

    def close(self) -> None:
        """Wait for a pending write (raising its failure) and release orbax's threads."""
        try:
            self.wait_published()
        finally:
            self._checkpointer.close()

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_arrays(path: Path, shardings: Targets | None = None) -> dict[str, dict[str, jax.Array]]:
    """`{"model": {name: array}, "optimizer": {name: array}}` from `path/arrays`.

    Each array is read onto its sharding in `shardings` (same nesting; by default, and for
    arrays whose saved shape differs, the first device). Names and shapes are not checked here:
    `zoo.tree.fill` does that and says what differs. A folder orbax cannot read raises
    `CorruptCheckpoint`."""
    ocp = require_orbax()
    folder = Path(path).absolute() / ARRAYS_DIR  # orbax takes absolute paths only
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            saved = checkpointer.metadata(folder).item_metadata.tree
            target = {}
            for part, arrays in saved.items():
                wanted = (shardings or {}).get(part, {})
                target[part] = {
                    name: jax.ShapeDtypeStruct(
                        tuple(meta.shape), meta.dtype, sharding=wanted.get(name, device)
                    )
                    for name, meta in arrays.items()
                }
            return checkpointer.restore(folder, target)
        except Exception as error:  # orbax raises many kinds for a damaged folder
            raise CorruptCheckpoint(f"{ARRAYS_DIR}/ is unreadable ({error})") from None
