"""Save and load models as `model.safetensors` + `config.json` (no pickle anywhere).

A saved model directory holds:
- `config.json`: `{"flavor": ..., "config": {...}, "zoo_version": ..., **extra}`
- `model.safetensors`: every array, named by its path in the module (`layers.blocks.ffn...`)
- `zoo_tokenizer.json` (optional): the tokenizer the model was trained with
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from zoo.data.tokenizers.base import TOKENIZER_FILE, Tokenizer, load_tokenizer
from zoo.data.tokenizers.pair import source_tokenizer, target_tokenizer
from zoo.files import (
    JSONObject,
    damaged,
    read_json_object,
    save_safetensors,
    write_atomic,
    write_text_atomic,
)
from zoo.models import FLAVORS, TransformerConfig, flavor_of
from zoo.nn.lora import AdapterShape, describe, has_lora, rebuild
from zoo.nn.quantized import QUANTIZED_LINEARS, quantize_at, quantized_mode, quantized_paths
from zoo.presets import build
from zoo.tree import fill, named_arrays
from zoo.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# What to do about a damaged file of a saved model (a run's checkpoints hold the same weights).
DAMAGED_FIX = (
    "save the model again (zoo.save), or for a `zoo train` run rebuild the folder with "
    "`zoo train ... --resume` from its checkpoints/"
)


def model_config_dict(model: eqx.Module) -> JSONObject:
    """Flavor and config; for a model with LoRA adapters also their layout (`zoo.lora`), and
    for one with int8 layers their paths (`saved_adapters` and `saved_quantized` read them)."""
    config = model.config  # type: ignore[attr-defined]
    meta: JSONObject = {"flavor": flavor_of(model), "config": config.to_dict()}
    if has_lora(model):
        adapters = describe(model).items()
        saved: JSONObject = {}
        for path, adapter in adapters:
            entry: JSONObject = {"rank": adapter["rank"], "alpha": adapter["alpha"]}
            if "dropout" in adapter:
                entry["dropout"] = adapter["dropout"]
            saved[path] = entry
        meta["lora"] = saved
    if quantized := quantized_paths(model):  # int8 or NF4 layers (zoo.lora.quantize)
        meta["quantized"] = {"mode": quantized_mode(model), "paths": list(quantized)}
    return meta


def save(
    model: eqx.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: Tokenizer | None = None,
    extra: Mapping[str, object] | None = None,
) -> Path:
    """Write `model` (and its tokenizer) to `directory`; each file is replaced atomically.

    `extra` adds entries to `config.json` (JSON values: `zoo train` records its summary)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, array in named_arrays(model).items():
        host = np.asarray(jnp.asarray(array, jnp.float32) if array.dtype == jnp.bfloat16 else array)
        tensors[name] = np.ascontiguousarray(host)
    try:  # a full disk leaves no temporary file behind
        write_atomic(directory / WEIGHTS_FILE, lambda tmp: save_safetensors(tensors, tmp))
    except OSError as error:
        raise OSError(
            error.errno, f"could not save the model to {directory} ({error.strerror or error})"
        ) from None
    meta: dict[str, object] = {
        **model_config_dict(model),
        "zoo_version": __version__,
        **(extra or {}),
    }
    if tokenizer is not None:  # load_with_tokenizer checks that the same tokenizer comes back
        meta["tokenizer"] = {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size}
    write_text_atomic(directory / CONFIG_FILE, json.dumps(meta, indent=2, sort_keys=True))
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory


def is_zoo_folder(folder: Path) -> bool:
    """Whether `folder/config.json` is a zoo model's (it names a flavor), not HuggingFace's."""
    config = folder / CONFIG_FILE
    if not config.is_file():
        return False
    fix = f"{DAMAGED_FIX}; for a HuggingFace checkpoint folder, download it again"
    return "flavor" in read_json_object(config, fix=fix)


def read_config(directory: str | os.PathLike) -> tuple[TransformerConfig, JSONObject]:
    """The config stored in a saved model directory, and all that `config.json` holds."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {directory}: not a saved zoo model (see zoo.save)"
        )
    meta = read_json_object(path, fix=DAMAGED_FIX)
    flavor, fields = meta.get("flavor"), meta.get("config")
    if not isinstance(flavor, str) or flavor not in FLAVORS:
        raise ValueError(f"{path}: unknown flavor {flavor!r}; expected one of {sorted(FLAVORS)}")
    if not isinstance(fields, dict):
        raise ValueError(f'{path} is damaged (no "config" object); {DAMAGED_FIX}')
    config_class = FLAVORS[flavor][0]
    if not issubclass(config_class, TransformerConfig):
        raise TypeError(f"zoo.models.FLAVORS[{flavor!r}] holds no config class")
    return config_class.from_dict(fields), meta


def saved_adapters(meta: JSONObject, path: Path) -> dict[str, AdapterShape]:
    """The LoRA adapters `config.json` (at `path`) records, checked; `{}` for none."""
    saved = meta.get("lora") or {}
    if not isinstance(saved, dict):
        raise damaged(path, f'"lora" is a {type(saved).__name__}, not an object', DAMAGED_FIX)
    layout: dict[str, AdapterShape] = {}
    for name, entry in saved.items():
        rank = entry.get("rank") if isinstance(entry, dict) else None
        alpha = entry.get("alpha") if isinstance(entry, dict) else None
        if not isinstance(rank, int) or not isinstance(alpha, int | float):
            detail = f"the adapter at {name!r} has no whole rank and numeric alpha"
            raise damaged(path, detail, DAMAGED_FIX)
        layout[name] = {"rank": rank, "alpha": float(alpha)}
        dropout = entry.get("dropout", 0.0) if isinstance(entry, dict) else 0.0
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, int | float)
            or not 0 <= dropout < 1
        ):
            raise damaged(path, f"the adapter at {name!r} has dropout {dropout!r}", DAMAGED_FIX)
        if dropout:
            layout[name]["dropout"] = float(dropout)
    return layout


def saved_quantized(meta: JSONObject, path: Path) -> tuple[list[str], str]:
    """The paths of the quantized layers `config.json` (at `path`) records, checked (`[]` for
    none), and their mode ("int8" or "nf4")."""
    saved = meta.get("quantized")
    if not saved:
        return [], "int8"
    paths = saved.get("paths") if isinstance(saved, dict) else None
    names = [name for name in paths if isinstance(name, str)] if isinstance(paths, list) else []
    if not isinstance(paths, list) or len(names) != len(paths):
        raise damaged(path, '"quantized" has no list of layer paths', DAMAGED_FIX)
    mode = saved.get("mode", "int8") if isinstance(saved, dict) else "int8"
    if mode not in QUANTIZED_LINEARS:
        raise damaged(path, f'"quantized" has the mode {mode!r}, not int8 or nf4', DAMAGED_FIX)
    return names, str(mode)


def load(directory: str | os.PathLike) -> eqx.Module:
    """Rebuild the model saved in `directory` by `zoo.save` (weights bit for bit)."""
    config, meta = read_config(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {directory}")
    adapters = saved_adapters(meta, Path(directory) / CONFIG_FILE)
    quantized, mode = saved_quantized(meta, Path(directory) / CONFIG_FILE)

    def skeleton_model() -> eqx.Module:  # saved LoRA adapters (and an int8 base) come back so
        model = build(config, key=jax.random.key(0))
        model = rebuild(model, adapters) if adapters else model
        return quantize_at(model, quantized, mode) if quantized else model

    skeleton = eqx.filter_eval_shape(skeleton_model)
    try:
        tensors = safetensors.numpy.load_file(str(weights))
    except safetensors.SafetensorError as error:
        raise ValueError(
            f"{weights} is damaged ({error}): it is not a complete safetensors file; {DAMAGED_FIX}"
        ) from None
    return fill(skeleton, tensors, str(weights))


def load_with_tokenizer(directory: str | os.PathLike) -> tuple[eqx.Module, Tokenizer | None]:
    """The saved model and its tokenizer (None when the directory has none)."""
    model = load(directory)
    try:
        tokenizer = load_tokenizer(directory)
    except FileNotFoundError:
        return model, None
    check_tokenizer_fits(model, tokenizer, read_config(directory)[1], Path(directory))
    return model, tokenizer


def check_tokenizer_fits(
    model: eqx.Module, tokenizer: Tokenizer, meta: JSONObject, directory: Path
) -> None:
    """The tokenizer beside a model is the one it was saved with (sizes recorded in config.json),
    and never makes ids past the model's vocabulary (older folders)."""
    where = directory / TOKENIZER_FILE
    fix = "put back the tokenizer the model was trained with, or save both again with zoo.save"
    recorded = meta.get("tokenizer")
    if isinstance(recorded, dict) and recorded.get("vocab_size") != tokenizer.vocab_size:
        raise ValueError(
            f"{where} has {tokenizer.vocab_size} tokens, but the model was saved with a "
            f"{recorded.get('kind')} tokenizer of {recorded.get('vocab_size')}: it belongs to "
            f"another corpus or model; {fix}"
        )
    config = model.config  # type: ignore[attr-defined]
    sizes = [("", tokenizer.vocab_size, config.vocab_size)]
    if flavor_of(model) == "translator":
        sizes = [
            ("source ", source_tokenizer(tokenizer).vocab_size, config.vocab_size),
            ("target ", target_tokenizer(tokenizer).vocab_size, config.tgt_vocab),
        ]
    for side, tokens, vocab in sizes:
        if tokens > vocab:
            raise ValueError(
                f"{where}: the {side}tokenizer has {tokens} tokens but the model's {side}"
                f"vocabulary only {vocab}, so its ids would fall outside the model; {fix}"
            )
