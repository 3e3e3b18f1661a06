"""Named model configurations: `zoo.create("gpt2", key=...)`.

Tiny presets are for tests and the demo; the others reproduce published shapes. Each is a
family of base parts (`zoo.presets.parts`) at a shape: `decoders`, `layer_kinds`, `moe`,
`encoders` and `translators` list them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray

from zoo.models import FLAVORS, TransformerConfig
from zoo.presets import decoders, encoders, layer_kinds, moe, translators


@dataclass(frozen=True)
class Preset:
    name: str
    flavor: str  # classifier | gpt | translator
    config: TransformerConfig
    description: str


_PRESETS: dict[str, Preset] = {}


def register(name: str, config: TransformerConfig, description: str) -> Preset:
    """Add a preset (or replace one of the same name)."""
    for flavor, (config_cls, _) in FLAVORS.items():
        if type(config) is config_cls:
            preset = Preset(name, flavor, config, description)
            _PRESETS[name] = preset
            return preset
    raise TypeError(f"not a zoo config: {type(config).__name__}")


def names() -> list[str]:
    """Every preset name, sorted."""
    return sorted(_PRESETS)


def get(name: str) -> Preset:
    """The preset called `name`; an unknown name raises with the closest names."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name, list(_PRESETS), n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown preset {name!r}.{hint} Available: {', '.join(names())}")
    return _PRESETS[name]


def config(name: str, **overrides: object) -> TransformerConfig:
    """The config of preset `name` with some fields changed."""
    return get(name).config.replace(**overrides)


def create(name: str, *, key: PRNGKeyArray, **overrides: object) -> eqx.Module:
    """Build the model of preset `name`; keyword overrides change config fields, by name, path
    or flat alias (`TransformerConfig.replace`: `num_layers=4`, `**{"attention.window": 8}`)."""
    cfg = config(name, **overrides)
    _, model_cls = FLAVORS[get(name).flavor]
    return model_cls(cfg, key=key)


def build(config: TransformerConfig, *, key: PRNGKeyArray) -> eqx.Module:
    """Build the model that a config describes."""
    for config_cls, model_cls in FLAVORS.values():
        if type(config) is config_cls:
            return model_cls(config, key=key)
    raise TypeError(f"not a zoo config: {type(config).__name__}")


def count_params(model: object) -> int:
    """Number of parameters: array elements in the model (works on `filter_eval_shape` output)."""
    leaves = jax.tree_util.tree_leaves(model)
    return int(sum(leaf.size for leaf in leaves if hasattr(leaf, "shape")))


def abstract(name: str, **overrides: object) -> eqx.Module:
    """The model of a preset as shapes only (`jax.ShapeDtypeStruct` leaves): no memory used."""
    return eqx.filter_eval_shape(lambda: create(name, key=jax.random.key(0), **overrides))


def param_count(name: str, **overrides: object) -> int:
    """Parameter count of a preset, computed without allocating the weights."""
    return count_params(abstract(name, **overrides))


for _family in (decoders, layer_kinds, moe, encoders, translators):
    for _name, (_config, _description) in _family.presets().items():
        register(_name, _config, _description)
