"""zoo: a functional model zoo of transformers in JAX and Equinox.

Three flavors share one set of per-example layers (`zoo.nn`):

- `zoo.Classifier`: encoder-only, `Int[Array, "seq"] -> Float[Array, "classes"]`
- `zoo.GPT`: decoder-only, `Int[Array, "seq"] -> Float[Array, "seq vocab"]`
- `zoo.Translator`: encoder-decoder, `(Int["src"], Int["tgt"]) -> Float["tgt vocab"]`

Build one from a preset with `zoo.create("gpt2", key=jax.random.key(0))`; batch with `jax.vmap`.
"""

from __future__ import annotations

import importlib
from typing import Any

from zoo import nn, presets
from zoo.models import (
    GPT,
    Classifier,
    ClassifierConfig,
    GPTConfig,
    TransformerConfig,
    Translator,
    TranslatorConfig,
)
from zoo.presets import build, count_params, create
from zoo.version import __version__ as __version__

# Public names that live in heavier modules, imported on first use so `import zoo` stays quick.
_LAZY = {
    "Trainer": "zoo.train",
    "LoopSettings": "zoo.train",
    "Outputs": "zoo.train",
    "load": "zoo.serialize",
    "save": "zoo.serialize",
    "generate": "zoo.decoding",
    "translate": "zoo.decoding",
    "classify": "zoo.decoding",
    "SamplingSettings": "zoo.decoding",
    "chat": "zoo.decoding.chat",
    "attention_maps": "zoo.inspection",
    "from_pretrained": "zoo.interop",
    "from_hf": "zoo.interop",
    "to_hf": "zoo.interop",
}
_LAZY_MODULES = ("data", "tasks", "train", "decoding", "inspection", "interop", "serialize", "lora",
                 "distributed")  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


__all__ = [
    "GPT",
    "Classifier",
    "ClassifierConfig",
    "GPTConfig",
    "TransformerConfig",
    "Translator",
    "TranslatorConfig",
    "build",
    "count_params",
    "create",
    "nn",
    "presets",
    *_LAZY,
]
