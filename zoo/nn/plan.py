"""How the layers of a stack differ: one `LayerPlan` of a base block and overrides by layer.

A plan holds the settings of a base block, the number of layers, and `LayerOverride`s: each
changes some settings of the base (dotted paths into `BlockSettings`) on a set of layers. That
is every way today's families make layer i differ:

- its weights: Qwen's dense layers among mixture-of-experts ones (`{"feed_forward": ...}` on
  `layers=(...)`), DeepSeek's first dense layers (`stop=k`), ModernBERT's layer 0 without a
  norm before its attention (`{"attention_norm": False}` on `layers=(0,)`);
- its call: Gemma's global layers among sliding-window ones (`{"attention.window": None}`
  every second or sixth layer), with their own rotary base (`{"attention.rope": ...}`).

`LayerStack` builds one stack from a plan: layers whose weights have one shape share stacked
arrays, and a layer's call (`LayerCall`: its window and rotary base) is a setting of that
layer, not of its weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from zoo.nn.block import BlockSettings
from zoo.nn.rotary import Rope
from zoo.records import FrozenMap, coerce, encode, replace_path, type_at


@dataclass(frozen=True, kw_only=True)
class LayerOverride:
    """Settings that differ on some layers of a `LayerPlan`.

    `changes` maps dotted paths of `BlockSettings` to their values on those layers
    (`{"attention.window": None}`). The layers are `layers` when given, else
    `range(start, stop, step)` (`stop` None: to the last layer).
    """

    changes: Mapping[str, object]  # dotted path in BlockSettings -> its value on these layers
    layers: tuple[int, ...] | None = None  # these layers; None: the range below
    start: int = 0  # the range's first layer
    stop: int | None = None  # the range's end (excluded); None: the number of layers
    step: int = 1  # every step-th layer from start

    def __post_init__(self) -> None:
        if not self.changes:
            raise ValueError("a LayerOverride changes at least one setting")
        typed = {
            path: coerce(type_at(BlockSettings, path), value, path)
            for path, value in self.changes.items()
        }
        object.__setattr__(self, "changes", FrozenMap(typed))
        if self.layers is not None:
            layers = tuple(self.layers)
            if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers):
                raise ValueError(f"override layers must be integers >= 0, got {layers}")
            object.__setattr__(self, "layers", layers)
        for name, least in (("start", 0), ("step", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"override {name} must be an integer >= {least}, got {value!r}")

    def selects(self, num_layers: int) -> tuple[int, ...]:
        """The layers of a `num_layers` stack this override changes."""
        if self.layers is not None:
            outside = [i for i in self.layers if i >= num_layers]
            if outside:
                raise ValueError(
                    f"a layer override names layers {outside}, which a {num_layers}-layer stack "
                    "does not have: change the override with the number of layers"
                )
            return self.layers
        stop = num_layers if self.stop is None else min(self.stop, num_layers)
        return tuple(range(self.start, stop, self.step))

    def to_data(self) -> dict[str, object]:
        data: dict[str, object] = {
            "changes": {
                path: encode(type_at(BlockSettings, path), value)
                for path, value in self.changes.items()
            }
        }
        if self.layers is not None:
            data["layers"] = list(self.layers)
        else:
            data.update(start=self.start, stop=self.stop, step=self.step)
        return data


@dataclass(frozen=True, kw_only=True)
class LayerPlan:
    """The blocks of a stack: `num_layers` layers of the `block` settings, changed on some
    layers by `overrides` (applied in order)."""

    block: BlockSettings = field(default_factory=BlockSettings)  # every layer's, unless changed
    num_layers: int = 6  # transformer blocks
    overrides: tuple[LayerOverride, ...] = ()  # settings that differ by layer

    def __post_init__(self) -> None:
        count = self.num_layers
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {count!r}")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        self.layers()  # a change that does not fit the base block fails now

    def layers(self) -> tuple[BlockSettings, ...]:
        """Each layer's settings, first to last."""
        settings = [self.block] * self.num_layers
        for override in self.overrides:
            for layer in override.selects(self.num_layers):
                for path, value in override.changes.items():
                    settings[layer] = replace_path(settings[layer], path, value)
        return tuple(settings)

    def layer(self, index: int) -> BlockSettings:
        """Layer `index`'s settings."""
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} is not a layer of a {self.num_layers}-layer plan")
        return self.layers()[index]


class LayerCall(NamedTuple):
    """How a layer calls its self-attention, beside its weights: the window and the rotary
    base (layers that differ only in these share stacked weights)."""

    window: int | None
    rope: Rope | None

    @staticmethod
    def of(settings: BlockSettings) -> LayerCall:
        return LayerCall(settings.attention.window, settings.attention.rope)


def weights_of(settings: BlockSettings) -> BlockSettings:
    """`settings` without its call (`LayerCall`): equal for layers whose weights stack."""
    attention = dataclasses.replace(settings.attention, window=None, rope=None)
    return dataclasses.replace(settings, attention=attention)
