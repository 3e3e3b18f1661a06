"""The arrays a run does not train, left out of its checkpoints and recognised on resume.

A LoRA run (or one with `--freeze`) trains a small part of its model: SmolLM2-135M's attention
adapters are 0.5 MB of its 540 MB, a 7B model's a few tens of MB of 28 GB. Its checkpoints hold
the trained arrays and the optimizer state only. The frozen rest is rebuilt on resume as the run
built it (the same `--init`, quantization and seed), and must be the same arrays: each
checkpoint records the frozen arrays' names and a fingerprint, and a resume whose frozen arrays
differ is refused.

The fingerprint is a sha256 over each frozen array's name, shape, dtype and the bytes of up to
4,096 elements spread evenly through it: bit-exact on any device and sharding (no float sums),
cheap for a large base (a few thousand elements a weight reach the host, once a run), and two
different checkpoints of one architecture differ in nearly every element.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from zoo.files import JSONObject, JSONValue
from zoo.tree import Slot, named_arrays, path_name

FROZEN = "frozen"  # the key of the record in a checkpoint's state.json
SAMPLE = 4096  # elements of each frozen array in the fingerprint


@dataclass(frozen=True)
class FrozenArrays:
    """The arrays a run does not train: their names and fingerprint."""

    names: tuple[str, ...]
    fingerprint: str

    def record(self) -> JSONObject:
        """What a checkpoint's state.json holds of it."""
        return {"names": [name for name in self.names], "fingerprint": self.fingerprint}


def frozen_names(optimizer: object, model: eqx.Module) -> tuple[str, ...]:
    """The names of the arrays of `model` that `optimizer` does not train (its `labels`:
    "train" or "frozen", as `zoo.train.freeze` and `zoo.lora.only_adapters` make them); none
    for an optimizer without labels, which trains every floating-point array."""
    labels = getattr(optimizer, "labels", None)
    if labels is None:
        return ()
    label_tree = labels(eqx.filter(model, eqx.is_inexact_array))
    flat, _ = jax.tree_util.tree_flatten_with_path(label_tree)
    trained = {path_name(path) for path, label in flat if label == "train"}
    return tuple(sorted(set(named_arrays(model)) - trained))


def frozen_arrays(optimizer: object, model: eqx.Module) -> FrozenArrays | None:
    """The frozen arrays of `model` under `optimizer` with their fingerprint; None where every
    array is trained."""
    names = frozen_names(optimizer, model)
    if not names:
        return None
    return FrozenArrays(names, fingerprint(named_arrays(model), names))


def fingerprint(arrays: Mapping[str, Slot], names: tuple[str, ...]) -> str:
    """sha256 of the arrays `names` of `arrays` (see the module doc)."""
    samples = _samples({name: arrays[name] for name in names})
    digest = hashlib.sha256()
    for name in names:
        array = arrays[name]
        digest.update(f"{name}|{tuple(array.shape)}|{jnp.dtype(array.dtype).name}|".encode())
        digest.update(samples[name].tobytes())
    return digest.hexdigest()


def _positions(shape: tuple[int, ...]) -> np.ndarray:
    """Up to `SAMPLE` flat indices, evenly spaced, of an array of `shape`."""
    size = int(np.prod(shape))
    return np.unique(np.linspace(0, max(size - 1, 0), num=min(SAMPLE, size), dtype=np.int64))


def _samples(arrays: Mapping[str, Slot]) -> dict[str, np.ndarray]:
    """Each array's `_positions` elements on the host: one compiled gather for the device
    arrays (collected from every process where each holds a part)."""
    host = {name: a for name, a in arrays.items() if isinstance(a, np.ndarray)}
    samples = {
        name: np.ascontiguousarray(a.reshape(-1)[_positions(a.shape)]) for name, a in host.items()
    }
    on_device = {name: a for name, a in arrays.items() if name not in host}
    if on_device:
        picks = {name: jnp.asarray(_positions(a.shape), jnp.int32) for name, a in on_device.items()}
        taken = _take_flat(on_device, picks)
        for name, values in taken.items():
            if not values.is_fully_addressable:  # many processes: each holds part of it
                from jax.experimental import multihost_utils

                values = multihost_utils.process_allgather(values, tiled=True)
            samples[name] = np.asarray(values)
    return samples


@jax.jit
def _take_flat(arrays: dict[str, jax.Array], picks: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {name: array.reshape(-1)[picks[name]] for name, array in arrays.items()}


def recorded_names(record: object) -> tuple[str, ...]:
    """The array names a `frozen` record of state.json lists (none for another value)."""
    names = record.get("names") if isinstance(record, Mapping) else None
    if not isinstance(names, list):
        return ()
    return tuple(name for name in names if isinstance(name, str))


def saved_arrays(model: eqx.Module, extra: Mapping[str, object] | None) -> dict[str, Slot]:
    """The arrays of `model` a checkpoint holds: all, or those the `frozen` record of its state
    (`extra`, see `frozen_extra`) does not name."""
    arrays = named_arrays(model)
    skipped = set(recorded_names((extra or {}).get(FROZEN)))
    return {name: array for name, array in arrays.items() if name not in skipped}


def frozen_extra(
    extra: Mapping[str, JSONValue] | None, frozen: FrozenArrays | None
) -> JSONObject | None:
    """`extra` with the frozen arrays' record (`zoo.train.frozen`), for state.json."""
    if extra is None and frozen is None:
        return None
    record: JSONObject = dict(extra or {})
    if frozen is not None:
        record[FROZEN] = frozen.record()
    return record


def check_frozen(path: object, record: object, model: eqx.Module) -> tuple[str, ...]:
    """The names of the frozen arrays a checkpoint at `path` left out (its `record`), refused
    when `model`'s arrays of those names are missing or differ from the saved run's."""
    names = recorded_names(record)
    saved = record.get("fingerprint") if isinstance(record, Mapping) else None
    arrays = named_arrays(model)
    missing = [name for name in names if name not in arrays]
    if missing or fingerprint(arrays, names) != saved:
        detail = f"has no arrays {missing[:3]}" if missing else "differs"
        raise ValueError(
            f"checkpoint {path} holds the trained arrays only, and this run's frozen rest "
            f"({len(names)} arrays: the base it adapts) {detail} from the one it was trained "
            "on; resume with the same --init (and --quantize, --lora, --freeze), or train into "
            "a new directory"
        )
    return names
