"""One file per HuggingFace family: its config builder and its key map, both directions.

`ARCHITECTURES` maps a `config.json`'s `model_type` to the family that reads it;
`architecture_of(config)` picks one for loading and `architecture_for(model)` the one a zoo
model exports to. A new family is a module here (an `Architecture` from
`zoo.interop.architecture`) and a line in `ARCHITECTURES`.
"""

from __future__ import annotations

from collections.abc import Mapping

import equinox as eqx

from zoo.interop.architecture import Architecture, UnsupportedConfig, config_of
from zoo.interop.architectures.bert import Bert
from zoo.interop.architectures.distilbert import DistilBert
from zoo.interop.architectures.gemma import GEMMA_FAMILIES, gemma_family_for
from zoo.interop.architectures.gpt2 import GPT2
from zoo.interop.architectures.llama import DECODER_FAMILIES, decoder_family_for
from zoo.interop.architectures.marian import Marian
from zoo.interop.architectures.modernbert import MODERNBERT
from zoo.interop.architectures.moe import MOE_FAMILIES, moe_family_for
from zoo.interop.architectures.olmo2 import OLMO2
from zoo.interop.architectures.olmo3 import OLMO3
from zoo.interop.architectures.phi3 import PHI3
from zoo.interop.architectures.roberta import Roberta, XLMRoberta
from zoo.interop.architectures.smollm3 import SMOLLM3
from zoo.interop.architectures.t5 import MT5, REFUSED_MODEL_TYPES, T5
from zoo.models import ClassifierConfig, GPTConfig, TransformerConfig, TranslatorConfig, flavor_of

DECODER_MODEL_TYPES = {family.model_type for family in DECODER_FAMILIES}
ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a for a in (GPT2(), Bert(), Marian(), *DECODER_FAMILIES, T5(), MT5())
}
ARCHITECTURES.update({a.model_type: a for a in MOE_FAMILIES})  # mixtures of experts
# the encoder families beside BERT
ARCHITECTURES.update({a.model_type: a for a in (Roberta(), XLMRoberta(), DistilBert(), MODERNBERT)})
# decoders whose parts go beyond Llama's
ARCHITECTURES.update({a.model_type: a for a in (*GEMMA_FAMILIES, OLMO2, OLMO3, PHI3, SMOLLM3)})


def architecture_of(config: Mapping[str, object]) -> Architecture:
    """The architecture a HuggingFace config dict describes (by its `model_type`)."""
    model_type = config.get("model_type")
    if model_type in REFUSED_MODEL_TYPES:
        raise UnsupportedConfig(
            f"model_type={model_type!r} is not supported: {REFUSED_MODEL_TYPES[model_type]}"
        )
    if model_type not in ARCHITECTURES:
        raise UnsupportedConfig(
            f"model_type={model_type!r} is not supported; zoo loads {sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type]


# zoo flavor -> the HuggingFace architecture it exports to
EXPORTS = {"gpt": "gpt2", "classifier": "bert", "translator": "marian"}


def architecture_for(model: eqx.Module | TransformerConfig) -> Architecture:
    """The architecture a zoo model (or config) exports to.

    A GPT with Gemma's `1 + weight` norms exports to Gemma 3 (with QK-norm) or Gemma 2, one
    with norms on the sub-layer outputs only to OLMo 3 (when some layer has a window or the
    layers differ) or OLMo 2, one with LongRoPE or partial rotary to Phi-3 (its fused
    projections), one with layers without rotary among rotary ones to SmolLM3. Another GPT
    with rotary positions is a
    Llama-style decoder: it exports to the simplest of Llama, Mistral, Qwen2 and Qwen3 that
    expresses its parts; other GPTs export to GPT-2. A classifier
    with RoBERTa's position offset exports to RoBERTa (XLM-R checkpoints too: the same network),
    one with DistilBERT's ReLU head to DistilBERT, one whose head ends in a norm to ModernBERT,
    others to BERT. A translator with relative
    positions is a T5; other translators export to MarianMT.
    """
    config = config_of(model)
    if isinstance(config, GPTConfig):
        return _decoder_architecture(config)
    if isinstance(config, TranslatorConfig) and config.relative is not None:
        return ARCHITECTURES["t5"]
    if isinstance(config, ClassifierConfig):
        pooler = config.head.pooler
        if pooler is not None and pooler.norm:
            return MODERNBERT
        if config.embedder.position_offset > 0:
            return ARCHITECTURES["roberta"]
        if pooler is not None and pooler.activation == "relu":
            return ARCHITECTURES["distilbert"]
    return ARCHITECTURES[EXPORTS[flavor_of(config)]]


def _decoder_architecture(config: GPTConfig) -> Architecture:
    """The family a GPT exports to (`architecture_for`)."""
    block = config.layers.block
    rope = block.attention.rope
    if block.norm.weight_offset == 1.0:
        return gemma_family_for(config)
    layers = config.layers.layers()
    if block.output_norm and not block.norm_first:
        windowed = any(s.attention.window is not None for s in layers)
        return OLMO3 if windowed or config.layers.overrides else OLMO2
    if rope is not None and (rope.scaling == "longrope" or rope.partial_rotary_factor < 1.0):
        return PHI3
    if config.experts() is not None:
        return moe_family_for(config)
    if rope is not None and any(s.attention.rope is None for s in layers):
        return SMOLLM3
    if rope is not None:
        return decoder_family_for(config)
    return ARCHITECTURES["gpt2"]


__all__ = [
    "ARCHITECTURES",
    "DECODER_MODEL_TYPES",
    "EXPORTS",
    "REFUSED_MODEL_TYPES",
    "architecture_for",
    "architecture_of",
]
