"""What every supported HuggingFace architecture provides, and reading HF configs strictly.

An `Architecture` turns a HuggingFace `config.json` (a plain dict: no transformers needed) into a
zoo config, a zoo config back into a `config.json` dict, and either into the `KeyMap` the
conversion engine runs. Options that change the computation are either mapped or refused with
`UnsupportedConfig` naming the option; they are never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar

import equinox as eqx

from zoo.interop.files import HFDict
from zoo.interop.rules import KeyMap, Shape
from zoo.models import GPT, Classifier, TransformerConfig, Translator
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.plan import weights_of
from zoo.records import get_path

logger = logging.getLogger("zoo.interop")
ZooModel = GPT | Classifier | Translator
# what a HuggingFace config says of the zoo config: paths into its tree (dotted, short block
# paths such as "attention.num_kv_heads", or `TransformerConfig.aliases`) -> values, which
# change the architecture's `zoo_base` (`TransformerConfig.replace`)
ConfigFields = dict[str, object]

# HuggingFace activation names -> zoo activation names (`zoo.nn.feedforward.ACTIVATIONS`).
HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula written differently
    "silu": "silu",
    "swish": "silu",
}
# zoo activation -> the name written when exporting
ZOO_TO_HF_ACTIVATION = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


class UnsupportedConfig(ValueError):
    """A HuggingFace config option zoo does not implement; the message names the option."""


class UnsupportedExport(ValueError):
    """A zoo config the HuggingFace architecture cannot express; the message names the field."""


class HFConfig:
    """A HuggingFace `config.json` read with the defaults of its transformers config class."""

    def __init__(self, data: Mapping[str, object], defaults: Mapping[str, object], arch: str):
        self.data = dict(data)
        self.defaults = dict(defaults)
        self.arch = arch

    def __getitem__(self, name: str) -> Any:  # a JSON value, of the type the option has
        """The value in config.json, else transformers' default (an explicit null stays None)."""
        if name in self.data:
            return self.data[name]
        return self.defaults.get(name)

    def refuse(self, name: str, why: str, fix: str = "") -> None:
        raise UnsupportedConfig(
            f"{self.arch} config option {name}={self[name]!r} is not supported: {why}"
            + (f"; {fix}" if fix else "")
        )

    def require(self, name: str, allowed: tuple[object, ...], why: str) -> None:
        """Refuse `name` unless its value (an explicit null means the default) is in `allowed`."""
        value = self[name]
        if value is None:
            value = self.defaults.get(name)
        if value not in allowed:
            self.refuse(name, why)

    def activation(self, name: str) -> str:
        value = self[name]
        if value not in HF_ACTIVATIONS:
            self.refuse(name, f"zoo implements {sorted(HF_ACTIVATIONS)}")
        return HF_ACTIVATIONS[value]

    def token_id(self, name: str, vocab_size: int) -> int | None:
        """A special-token id, or None (with a warning) when it lies outside the vocabulary."""
        value = self[name]
        if isinstance(value, list):
            if not value:
                return None
            logger.warning("%s: %s=%s is a list; zoo uses the first id", self.arch, name, value)
            value = value[0]
        if value is not None and not 0 <= value < vocab_size:
            logger.warning(
                "%s: %s=%s is outside the vocabulary [0, %d); zoo leaves it unset",
                self.arch,
                name,
                value,
                vocab_size,
            )
            return None
        return value


def config_of(model: eqx.Module | TransformerConfig) -> TransformerConfig:
    """The config of a zoo model (or the config itself); `TypeError` for anything else."""
    if isinstance(model, TransformerConfig):
        return model
    if isinstance(model, GPT | Classifier | Translator):
        return model.config
    raise TypeError(f"not a zoo model or config: {type(model).__name__}")


def export_activation(config: TransformerConfig) -> str:
    """The HuggingFace name of the feed-forward's activation."""
    return ZOO_TO_HF_ACTIVATION[config.layers.block.feed_forward.activation]


def activation_dropout(config: TransformerConfig) -> float:
    """The dropout rate on the feed-forward hidden layer that `config` trains with."""
    feed_forward = config.layers.block.feed_forward
    return feed_forward.dropout if isinstance(feed_forward, FeedForwardSettings) else 0.0


def warn_activation_dropout(config: TransformerConfig, target: str) -> None:
    """GPT-2 and BERT have no dropout on the feed-forward hidden layer: say it is not exported."""
    rate = activation_dropout(config)
    if rate:
        logger.warning(
            "%s has no dropout on the feed-forward hidden layer: activation dropout %s is not "
            "exported (inference is unaffected)",
            target,
            rate,
        )


def require_fields(config: TransformerConfig, target: str, expected: Mapping[str, object]) -> None:
    """Refuse to export a zoo config whose settings differ from what `target` can express.

    `expected` maps paths into the config (dotted, or short block paths such as `"norm.kind"`,
    which are checked in every plan's base block) to the values `target` needs."""
    wrong = [
        f"{path}={value!r} (needs {needed!r})"
        for name, needed in expected.items()
        for path in config.paths(name)
        if (value := get_path(config, path)) != needed
    ]
    if wrong:
        raise UnsupportedExport(f"{target} cannot express this zoo model: {', '.join(wrong)}")


def refuse_layer_overrides(config: TransformerConfig, target: str) -> None:
    """Refuse to export a config whose layers differ (its plans' overrides): the checkpoint
    formats of the families without per-layer settings hold one setting for every layer."""
    for name in config.plans:
        if getattr(config, name).overrides:
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: {name}.overrides make some layers "
                "differ, and its config has one setting for every layer"
            )


def refuse_weight_overrides(config: TransformerConfig, target: str) -> None:
    """Refuse to export a config whose layers differ in more than their call (window and
    rotary: `zoo.nn.plan.LayerCall`): the families with per-layer kinds set only those."""
    base = weights_of(config.layers.block)
    for index, settings in enumerate(config.layers.layers()):
        if weights_of(settings) != base:
            raise UnsupportedExport(
                f"{target} cannot express this zoo model: layer {index} differs from the base "
                "block beyond its window and rotary positions (layers.overrides)"
            )


ConfigT = TypeVar("ConfigT", bound=TransformerConfig)


class Architecture(Generic[ConfigT]):
    """One HuggingFace architecture family and its zoo flavor (whose config is `ConfigT`)."""

    name: str  # the family, e.g. "gpt2"
    model_type: str  # config.json "model_type"
    loads: tuple[str, ...]  # transformers class names whose checkpoints load
    export_class: str  # the transformers class `to_hf` targets
    prefix: str  # key prefix of the base model inside the task model ("transformer.")
    config_class: str  # the transformers config class
    zoo_config_class: type[ConfigT]  # the zoo flavor's config
    zoo_base: ConfigT  # the family's parts, which `zoo_fields` change

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        """What a checkpoint (its config and its HF key -> shape) says of the zoo config:
        paths into `zoo_base` and their values."""
        raise NotImplementedError

    def zoo_config(self, fields: ConfigFields) -> ConfigT:
        """The zoo config of `zoo_fields`' paths: `zoo_base` with them changed. The preset
        parts' execution choices are not a checkpoint's: a loaded model keeps every
        intermediate in the backward (`remat=None`) unless `fields` (or an override of the
        caller) says otherwise."""
        return self.zoo_base.replace(**{"remat": None, **fields})

    def hf_defaults(self) -> HFDict:
        """The defaults of the transformers config class, for options a config.json omits."""
        raise NotImplementedError

    def hf_config(self, config: ConfigT) -> HFDict:
        """The `config.json` dict of `export_class` for a zoo config (refuses what it cannot say)."""
        raise NotImplementedError

    def transformers_config(self, transformers: ModuleType, config: ConfigT) -> Any:
        """The transformers config object of `hf_config(config)` (for `to_hf`)."""
        fields = {k: v for k, v in self.hf_config(config).items() if k != "model_type"}
        return getattr(transformers, self.config_class)(**fields)

    def key_map(self, config: ConfigT, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        """The rules for `config`; `shapes` are the checkpoint's when loading, None when exporting."""
        raise NotImplementedError

    def task_weights(self, hf_class: str) -> tuple[str, ...]:
        """HF keys every checkpoint of `hf_class` holds beyond the base model (its task head).

        A checkpoint whose config names `hf_class` but lacks them was saved incompletely (for
        example converted through `AutoModel`, which drops task heads): its logits would change.
        """
        return ()

    def stored_keys(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """A state dict in the layout the key map reads, from another layout of the same
        weights (transformers' in-memory form where it differs from its files); unchanged here."""
        return arrays

    def check_class(self, hf: HFConfig) -> None:
        classes = hf["architectures"] or []
        unknown = [c for c in classes if c not in self.loads]
        if unknown:
            raise UnsupportedConfig(
                f"{self.name}: architectures={unknown} is not supported; zoo loads "
                f"{', '.join(self.loads)}"
            )
