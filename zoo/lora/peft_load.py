"""Reading a PEFT LoRA adapter folder onto a zoo model (see `zoo.lora.peft` for the format)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TypeVar, cast

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from zoo.files import read_json_object
from zoo.interop.weights import read_safetensors
from zoo.lora.peft import CONFIG_FILE, PREFIX, WEIGHTS_FILE, Adapter, AdapterConfig, _Layout
from zoo.nn.linear import Linear
from zoo.nn.lora import LoRALinear, has_lora, is_linear, replace_at
from zoo.nn.nf4 import NF4Linear
from zoo.nn.quantized import QuantizedLinear, float_dtype, lead_axes, replace_projections
from zoo.tree import fill

Model = TypeVar("Model", bound=eqx.Module)
T = TypeVar("T")
# what to do about an adapter folder that cannot be read
FIX = "save the adapter again (zoo.lora.save_adapter), or download it again"


def _pattern_value(patterns: dict[str, T], module: str, default: T) -> T:
    """PEFT's `rank_pattern`/`alpha_pattern` lookup: a key matches a module name's suffix."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _read(directory: Path) -> tuple[AdapterConfig, dict[str, np.ndarray]]:
    if not (directory / CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {directory}: pass a PEFT adapter folder (save_pretrained of a "
            "peft model, or the adapter/ folder of `zoo train --lora`)"
        )
    config = cast(AdapterConfig, read_json_object(directory / CONFIG_FILE, fix=FIX))
    if config.get("peft_type") != "LORA":
        raise ValueError(
            f"{directory / CONFIG_FILE}: peft_type {config.get('peft_type')!r}; zoo loads LORA adapters only"
        )
    for name, value, allowed in (
        ("use_dora", config.get("use_dora"), (False, None)),
        ("bias", config.get("bias"), ("none", None)),
        ("lora_bias", config.get("lora_bias"), (False, None)),
    ):
        if value not in allowed:
            raise ValueError(
                f"{directory / CONFIG_FILE}: {name}={value!r} is not supported; zoo "
                f"loads plain LoRA adapters ({name}={allowed[0]!r})"
            )
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"no {WEIGHTS_FILE} in {directory} (an adapter folder needs both files)"
        )
    return config, read_safetensors(weights)


def _mismatch(directory: Path, config: AdapterConfig, detail: str) -> ValueError:
    base = config.get("base_model_name_or_path")
    made_for = f" (it names base_model_name_or_path={base!r})" if base else ""
    return ValueError(
        f"the adapter in {directory} does not fit this model: {detail}. It was made for another "
        f"base model{made_for}; load it onto that model"
    )


def load_adapter(model: Model, directory: str | Path) -> Model:
    """`model` with the LoRA adapter in a PEFT folder `directory` (and its `modules_to_save`).

    The adapter's modules must be layers of `model` with the same shapes; anything else raises
    naming the module and what this model has.
    """
    directory = Path(directory)
    if has_lora(model):
        raise ValueError("this model already has LoRA adapters; merge them (zoo.lora.merge) first")
    config, tensors = _read(directory)
    layout = _Layout(model)
    alpha_default = config.get("lora_alpha", 8)
    per_path: dict[str, dict[int | None, Adapter]] = {}
    per_expert: dict[str, Adapter] = {}
    extras = {}
    for name, array in tensors.items():
        inner = name.removeprefix(PREFIX)
        if not inner.endswith(".lora_A.weight"):
            if ".lora_B." not in inner:
                extras[inner] = array
            continue
        module = inner.removesuffix(".lora_A.weight")
        b_name = f"{PREFIX}{module}.lora_B.weight"
        if b_name not in tensors:
            raise _mismatch(directory, config, f"{module} has lora_A but no lora_B")
        if module in layout.experts.by_module:
            a, b = np.asarray(array, np.float32), np.asarray(tensors[b_name], np.float32)
            alpha = _pattern_value(config.get("alpha_pattern") or {}, module, alpha_default)
            rank = a.shape[0]
            scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
            per_expert[module] = (a, b, scale)
            continue
        if module not in layout.by_module:
            known = ", ".join(sorted(layout.by_module)[:4])
            raise _mismatch(
                directory,
                config,
                f"it adapts {module!r}, which this {layout.arch.name} model lacks (its layers: {known}, ...)",
            )
        a, b = np.asarray(array, np.float32), np.asarray(tensors[b_name], np.float32)
        rank = a.shape[0]
        alpha = _pattern_value(config.get("alpha_pattern") or {}, module, alpha_default)
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        rows = layout.slot_rows(module)
        for (path, index, _), (start, stop) in zip(layout.by_module[module], rows):
            linear = layout.linears[path]
            if a.shape[1] != linear.in_features or b.shape[0] != rows[-1][1]:
                raise _mismatch(
                    directory,
                    config,
                    f"{module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}, this model's layer is {rows[-1][1]} x {linear.in_features} (out x in)",
                )
            per_path.setdefault(path, {})[index] = (a, b[start:stop], scale)
    wrapped = {path: _stack(layout.linears[path], layers) for path, layers in per_path.items()}
    model = replace_at(model, wrapped, is_linear)
    try:
        model = replace_projections(model, layout.experts.stacked(per_expert))
    except ValueError as error:  # an expert adapter of another shape
        raise _mismatch(directory, config, str(error)) from None
    return _set_extras(model, layout, extras, directory, config)


def _stack(
    linear: Linear | QuantizedLinear | NF4Linear, layers: dict[int | None, Adapter]
) -> LoRALinear:
    """One `LoRALinear` from per-layer (A, B, scale); layers the adapter skips get B = 0."""
    dtype = float_dtype(linear)
    if None in layers:
        a, b, scale = layers[None]
        rank = a.shape[0]
        return LoRALinear(linear, jnp.asarray(a, dtype), jnp.asarray(b, dtype), alpha=scale * rank)
    count = lead_axes(linear)[0]
    ranks = {a.shape[0] for a, _, _ in layers.values()}
    scales = {s for _, _, s in layers.values()}
    rank = max(ranks)
    # one rank and scale for the stack: pad smaller ranks with zeros, fold differing scales into B
    fold = len(scales) > 1
    scale = 1.0 if fold else scales.pop()
    a_all = np.zeros((count, rank, linear.in_features), np.float32)
    b_all = np.zeros((count, linear.out_features, rank), np.float32)
    for index, (a, b, layer_scale) in layers.items():
        assert index is not None
        a_all[index, : a.shape[0]] = a
        b_all[index, :, : a.shape[0]] = b * (layer_scale if fold else 1.0)
    return LoRALinear(
        linear, jnp.asarray(a_all, dtype), jnp.asarray(b_all, dtype), alpha=scale * rank
    )


def _set_extras(
    model: Model,
    layout: _Layout,
    extras: dict[str, np.ndarray],
    directory: Path,
    config: AdapterConfig,
) -> Model:
    """Put the adapter's whole trained modules (`modules_to_save`, e.g. a classifier head) in."""
    if not extras:
        return model
    values = {}
    for rule in layout.rules:
        if len(rule.hf) == 1 and len(rule.zoo) == 1 and rule.hf[0] in extras:
            values[rule.zoo[0]] = rule.transform.to_zoo([extras.pop(rule.hf[0])])[0]
    if extras:
        raise _mismatch(
            directory, config, f"it holds {sorted(extras)}, which this model has no place for"
        )
    try:
        return fill(model, values, WEIGHTS_FILE, partial=True)
    except ValueError as error:  # a misshapen array, or one stacked or absent here
        raise _mismatch(directory, config, str(error)) from None
