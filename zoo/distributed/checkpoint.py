"""Sharded checkpoint arrays with orbax-checkpoint: each process writes the shards it holds.

A training checkpoint written on a mesh keeps `state.json` as always (`zoo.train.checkpoint`)
and, instead of `model.safetensors` + `optimizer.safetensors`, a folder `arrays/` written by
orbax: `{"model": {path: array}, "optimizer": {path: array}}`, each array named by its pytree
path. Restoring reads each array straight onto the sharding asked for, so a checkpoint moves
between meshes (fsdp=8 -> data=2,tensor=4) and onto one device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from zoo.extras import pip_install
from zoo.train.checkpoint import ARRAYS_DIR, CorruptCheckpoint


def require_orbax() -> Any:
    """The `orbax.checkpoint` module, or an ImportError that names the extra to install."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(
            "training on a mesh writes sharded checkpoints with orbax-checkpoint, which is not "
            f"installed: {pip_install('distributed')}"
        ) from None
    return ocp


def save_arrays(path: Path, model_arrays: dict[str, Any], state_arrays: dict[str, Any]) -> None:
    """Write the named arrays into `path/arrays` and wait until they are on disk."""
    ocp = require_orbax()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / ARRAYS_DIR, {"model": model_arrays, "optimizer": state_arrays})
        checkpointer.wait_until_finished()


def load_arrays(path: Path, shardings: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """`{"model": {name: array}, "optimizer": {name: array}}` from `path/arrays`.

    Each array is read onto its sharding in `shardings` (same nesting; by default, and for
    arrays whose saved shape differs, the first device). Names and shapes are not checked here:
    `zoo.serialize.fill` does that and says what differs. A folder orbax cannot read raises
    `CorruptCheckpoint`."""
    ocp = require_orbax()
    folder = path / ARRAYS_DIR
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
