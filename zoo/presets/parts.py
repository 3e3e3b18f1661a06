"""The base parts every preset is built from, and the tiny shapes of the test presets.

A family is a config of its parts' settings at some size: GPT-2's, Llama's, BERT's, the
paper's Transformer and T5 are written out here once, as records; every other family is one of
them with its differences (`with_parts`), and every preset is a family at a `Shape`
(`sized`). The `-tiny` presets start from `TINY`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from zoo.models.classifier import ClassifierConfig, ClassifierHead, Pooler
from zoo.models.config import TransformerConfig
from zoo.models.gpt import GPTConfig, LMHead
from zoo.models.translator import TranslatorConfig, TranslatorHead, decoder_plan
from zoo.nn.block import BlockSettings
from zoo.nn.embedding import EmbedderSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.moe import MoESettings
from zoo.nn.multihead import AttentionSettings, QKNorm
from zoo.nn.norm import NormSettings
from zoo.nn.plan import LayerOverride, LayerPlan
from zoo.nn.relative_position import RelativePositions
from zoo.nn.rotary import Rope

Config = TypeVar("Config", bound=TransformerConfig)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The sizes of a preset: what tells a family's presets apart."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int  # the feed-forward's width (an expert's, in a mixture of experts)
    max_positions: int
    num_kv_heads: int | None = None  # None: one per query head
    head_dim: int | None = None  # None: d_model // num_heads

    def but(self, **changes: int | None) -> Shape:
        """This shape with some sizes changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


# the tiny presets' shape, for tests and the demo (each tiny preset says what it changes)
TINY = Shape(vocab_size=64, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_positions=128)
# the tiny presets recompute elementwise work in the backward where that measured faster on a
# CPU (benchmarks/remat.py); the published sizes do it on a CPU only ("auto")
CPU_REMAT = "dots"


def with_parts(config: Config, changes: Mapping[str, object]) -> Config:
    """`config` with some parts changed, by dotted or short block path (`"attention.qk_norm"`
    changes every plan's base block), all at once."""
    return config.replace(**changes)


def sized(config: Config, shape: Shape, **changes: object) -> Config:
    """`config` at `shape`, with more fields changed by name or path."""
    sizes: dict[str, object] = dict(
        vocab_size=shape.vocab_size,
        d_model=shape.d_model,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        d_ff=shape.d_ff,
        max_positions=shape.max_positions,
    )
    for name in ("num_kv_heads", "head_dim"):  # else the family's own
        value = getattr(shape, name)
        if value is not None:
            sizes[f"attention.{name}"] = value
            if isinstance(config, TranslatorConfig):
                sizes[f"cross_attention.{name}"] = value
    return config.replace(**sizes, **changes)


# -- GPT-2 and Llama ---------------------------------------------------------------------------

# GPT-2 small: the GPT config's defaults (learned positions, pre-norm LayerNorms, dense tanh
# GELU, biases everywhere, dropout 0.1, a tied head)
GPT2 = GPTConfig(bos_id=50256, eos_id=50256)

# Llama: what today's decoders start from
LLAMA_BLOCK = BlockSettings(
    attention=AttentionSettings(  # GPT-2: biases, no rotary
        num_heads=32, qkv_bias=False, output_bias=False, rope=Rope()
    ),
    feed_forward=FeedForwardSettings(  # GPT-2: dense tanh GELU with biases
        d_ff=11008, kind="gated", activation="silu", bias=False
    ),
    norm=NormSettings(kind="rmsnorm", eps=1e-5),  # GPT-2: LayerNorm
    norm_first=True,
)
LLAMA = GPTConfig(
    vocab_size=32000,
    d_model=4096,
    max_positions=2048,
    embedder=EmbedderSettings(positions="none"),  # positions are the attention's rotations
    layers=LayerPlan(block=LLAMA_BLOCK, num_layers=32),
    remat="auto",
)

# Gemma 2 and 3: Llama with these changed (zoo.interop.architectures.gemma)
GEMMA: dict[str, object] = {
    "feed_forward.activation": "gelu_tanh",  # GeGLU
    "output_norm": True,  # a norm after each sub-layer too (sandwich)
    "norm.weight_offset": 1.0,  # RMSNorm scales by 1 + weight
    "norm.eps": 1e-6,
    "embedder.scale": True,  # embeddings times sqrt(d_model)
    "attention.head_dim": 256,
    "attention.scale_dim": 256.0,  # query_pre_attn_scalar
    "pad_id": 0,
    "bos_id": 2,
    "eos_id": 1,
}
GEMMA2: dict[str, object] = {  # sliding and global layers alternate, sliding first
    **GEMMA,
    "attention.softcap": 50.0,
    "head": LMHead(softcap=30.0),
    "attention.window": 4096,
    "layers.overrides": (LayerOverride(changes={"attention.window": None}, start=1, step=2),),
}
GEMMA3: dict[str, object] = {  # five sliding layers, then a global one, each with its base
    **GEMMA,
    "attention.qk_norm": QKNorm(eps=1e-6, weight_offset=1.0),
    "attention.rope": Rope(theta=10_000.0),  # the sliding layers'
    "attention.window": 512,
    "layers.overrides": (
        LayerOverride(
            changes={"attention.window": None, "attention.rope": Rope(theta=1_000_000.0)},
            start=5,
            step=6,
        ),
    ),
}

# OLMo 2: Llama with the norms moved onto the sub-layer outputs
OLMO2: dict[str, object] = {
    "norm_first": False,  # x + norm(f(x)) instead of x + f(norm(x))
    "output_norm": True,
    "attention.qk_norm": QKNorm(scope="projection", eps=1e-5),  # all heads at once
    "head": LMHead(tie=False),
}

# OLMo 3: OLMo 2 with three sliding-window layers to one full layer; the full layers' rotary
# alone is stretched (YaRN on the published sizes)
OLMO3: dict[str, object] = {
    **OLMO2,
    "attention.window": 4096,
    "layers.overrides": (LayerOverride(changes={"attention.window": None}, start=3, step=4),),
}

# SmolLM3: Llama with no rotary positions on every fourth layer (NoPE layers)
SMOLLM3: dict[str, object] = {
    "attention.rope": Rope(theta=5_000_000.0),
    "layers.overrides": (LayerOverride(changes={"attention.rope": None}, start=3, step=4),),
}

# Phi-3 / Phi-3.5 / Phi-4-mini: Llama's parts (the checkpoint fuses q/k/v and gate/up)
PHI3: dict[str, object] = {"head": LMHead(tie=False), "pad_id": None}

# Qwen2: biases on q/k/v only; Qwen3: QK-norm per head
QWEN2: dict[str, object] = {"attention.qkv_bias": True, "norm.eps": 1e-6}
QWEN3: dict[str, object] = {"attention.qk_norm": QKNorm(eps=1e-6), "norm.eps": 1e-6}

# -- mixtures of experts: Llama with an untied head and experts in every layer --------------


def experts(num_experts: int, top_k: int, **fields: object) -> dict[str, object]:
    """Llama's changes for a mixture of `num_experts` gated SiLU experts, top-`top_k`; `fields`
    are more `MoESettings` fields (the expert width is the shape's `d_ff`)."""
    settings = MoESettings(num_experts=num_experts, top_k=top_k, **fields)  # type: ignore[arg-type]
    return {"feed_forward": settings, "head": LMHead(tie=False)}


# -- BERT and its relatives ---------------------------------------------------------------------

BERT = ClassifierConfig()  # BERT-base uncased: the classifier config's defaults
# RoBERTa counts positions from pad_id + 1 and has one token type
ROBERTA: dict[str, object] = {
    "vocab_size": 50265,
    "pad_id": 1,
    "embedder.position_offset": 2,  # positions 2..513 of a 514-row table
    "max_positions": 514,
    "embedder.type_vocab_size": 1,
    "embedder.norm.eps": 1e-5,
    "norm.eps": 1e-5,
    "feed_forward.dropout": 0.0,  # as in transformers: none on the feed-forward hidden
}
# DistilBERT: 6 layers, no token types and a ReLU head
DISTILBERT: dict[str, object] = {
    "num_layers": 6,
    "embedder.type_vocab_size": 0,
    "head": ClassifierHead(pooler=Pooler(activation="relu"), dropout=0.2),
    "feed_forward.dropout": 0.0,
}
# ModernBERT: BERT pre-norm, rotary, GeGLU, local and global layers
MODERNBERT: dict[str, object] = {
    "norm_first": True,
    "norm": NormSettings(eps=1e-5, bias=False),
    "embedder": EmbedderSettings(positions="none", norm=NormSettings(eps=1e-5, bias=False)),
    "attention": AttentionSettings(
        num_heads=12,
        qkv_bias=False,
        output_bias=False,
        rope=Rope(theta=10_000.0),  # the local layers' base
        window=65,  # local layers see 64 positions either side (local_attention=128)
    ),
    "feed_forward": FeedForwardSettings(kind="gated", activation="gelu", bias=False),
    "dropout": 0.0,
    "head": ClassifierHead(pooler=Pooler(activation="gelu", bias=False, norm=True), dropout=0.0),
    "layers.overrides": (
        # a global layer every third, the first included, with its own base
        LayerOverride(
            changes={"attention.window": None, "attention.rope": Rope(theta=160_000.0)}, step=3
        ),
        # layer 0's attention reads the normed embeddings directly
        LayerOverride(changes={"attention_norm": False}, layers=(0,)),
    ),
    "vocab_size": 50368,
    "pad_id": 50283,
    "mask_id": 50284,
    "max_positions": 8192,
}

# -- the paper's Transformer and T5 -------------------------------------------------------------

TRANSFORMER = TranslatorConfig()  # the paper's base model: the translator config's defaults
T5_BLOCK = BlockSettings(
    attention=AttentionSettings(
        num_heads=8, head_dim=64, qkv_bias=False, output_bias=False, scale_dim=1.0, dropout=0.1
    ),
    feed_forward=FeedForwardSettings(d_ff=2048, activation="relu", bias=False, dropout=0.1),
    norm=NormSettings(kind="rmsnorm", eps=1e-6),
    norm_first=True,
    dropout=0.1,
)
T5 = TranslatorConfig(
    vocab_size=32128,  # SentencePiece's 32000 + 100 sentinels, padded
    max_positions=512,  # relative positions have no limit; T5 trained on 512
    embedder=EmbedderSettings(positions="none", dropout=0.1),
    layers=LayerPlan(block=T5_BLOCK, num_layers=6),
    decoder=decoder_plan(LayerPlan(block=T5_BLOCK, num_layers=6)),
    head=TranslatorHead(tie=True, scale=True),  # v1.0: tied and rescaled by d_model^-0.5
    relative=RelativePositions(),
    final_dropout=True,
    pad_id=0,
    bos_id=0,  # decoding starts from the pad id
    eos_id=1,
)
# v1.1 and FLAN-T5: gated tanh-GELU, an untied head, no rescale
T5_V1_1: dict[str, object] = {
    "feed_forward.kind": "gated",
    "feed_forward.activation": "gelu_tanh",
    "head": TranslatorHead(tie=False),
}


def no_dropout(config: Config) -> Config:
    """`config` without dropout anywhere (the tiny presets)."""
    return config.replace(dropout=0.0, attention_dropout=0.0)
