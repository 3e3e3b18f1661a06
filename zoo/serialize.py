"""Save and load models as `model.safetensors` + `config.json` (no pickle anywhere).

A saved model directory holds:
- `config.json`: `{"flavor": ..., "config": {...}, "zoo_version": ..., **extra}`
- `model.safetensors`: every array, named by its path in the module (`layers.blocks.ffn...`)
- `zoo_tokenizer.json` (optional): the tokenizer the model was trained with
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from zoo.data.tokenizer import Tokenizer, load_tokenizer, write_text_atomic
from zoo.models import FLAVORS, flavor_of

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def path_parts(path: tuple) -> list[str]:
    """The attribute names, dict keys and sequence indices of a pytree key path."""
    parts = []
    for entry in path:
        for attribute in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
        else:
            parts.append(str(entry))
    return parts


def path_name(path: tuple) -> str:
    """A pytree key path as a dotted name: `layers.blocks.self_attention.query_proj.weight`."""
    return ".".join(path_parts(path))


def _is_slot(leaf: Any) -> bool:
    return eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def named_arrays(model: eqx.Module) -> dict[str, Any]:
    """Every array leaf of `model` (or shape, after `filter_eval_shape`) keyed by its path."""
    arrays = eqx.filter(model, _is_slot)
    flat, _ = jax.tree_util.tree_flatten_with_path(arrays)
    return {path_name(path): leaf for path, leaf in flat}


def model_config_dict(model: eqx.Module) -> dict[str, Any]:
    """Flavor and config; for a model with LoRA adapters also their layout (`zoo.lora`)."""
    from zoo import lora

    config = model.config  # type: ignore[attr-defined]
    meta = {"flavor": flavor_of(model), "config": config.to_dict()}
    return meta | ({"lora": lora.describe(model)} if lora.has_lora(model) else {})


def save(
    model: eqx.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: Tokenizer | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write `model` (and its tokenizer) to `directory`; each file is replaced atomically."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, array in named_arrays(model).items():
        host = np.asarray(jnp.asarray(array, jnp.float32) if array.dtype == jnp.bfloat16 else array)
        tensors[name] = np.ascontiguousarray(host)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{WEIGHTS_FILE}.")
    os.close(fd)
    save_file(tensors, tmp)
    os.replace(tmp, directory / WEIGHTS_FILE)
    meta = {**model_config_dict(model), "zoo_version": _version(), **(extra or {})}
    write_text_atomic(directory / CONFIG_FILE, json.dumps(meta, indent=2, sort_keys=True))
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory


def read_config(directory: str | os.PathLike):
    """The config stored in a saved model directory (and its flavor)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {directory}: not a saved zoo model (see zoo.save)"
        )
    meta = json.loads(path.read_text(encoding="utf-8"))
    flavor = meta.get("flavor")
    if flavor not in FLAVORS:
        raise ValueError(f"{path}: unknown flavor {flavor!r}; expected one of {sorted(FLAVORS)}")
    config_cls: Any = FLAVORS[flavor][0]
    return config_cls.from_dict(meta["config"]), meta


def fill(skeleton: eqx.Module, tensors: dict[str, np.ndarray], source: str) -> eqx.Module:
    """Put `tensors` into the array slots of `skeleton`, checking names, shapes and dtypes."""
    expected = named_arrays(skeleton)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing arrays {missing}, unexpected arrays {unexpected}")
    leaves = []
    for name, slot in expected.items():
        value = tensors[name]
        if tuple(value.shape) != tuple(slot.shape):
            raise ValueError(
                f"{source}: array {name!r} has shape {tuple(value.shape)}, "
                f"the config needs {tuple(slot.shape)}"
            )
        leaves.append(jnp.asarray(value, dtype=slot.dtype))
    arrays, static = eqx.partition(skeleton, _is_slot)
    treedef = jax.tree_util.tree_structure(arrays)
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, leaves), static)


def load(directory: str | os.PathLike) -> eqx.Module:
    """Rebuild the model saved in `directory` by `zoo.save` (weights bit for bit)."""
    from safetensors.numpy import load_file

    from zoo import lora
    from zoo.presets import build

    config, meta = read_config(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {directory}")

    def skeleton_model():  # a model saved with LoRA adapters comes back with them
        model = build(config, key=jax.random.key(0))
        return lora.rebuild(model, meta["lora"]) if meta.get("lora") else model

    skeleton = eqx.filter_eval_shape(skeleton_model)
    return fill(skeleton, load_file(str(weights)), str(weights))


def load_with_tokenizer(directory: str | os.PathLike) -> tuple[eqx.Module, Tokenizer | None]:
    """The saved model and its tokenizer (None when the directory has none)."""
    model = load(directory)
    try:
        tokenizer = load_tokenizer(directory)
    except FileNotFoundError:
        tokenizer = None
    return model, tokenizer


def _version() -> str:
    from zoo import __version__

    return __version__
