"""Shared per-example layers: attention, embeddings, relative positions, feed-forward, blocks,
stacks."""

from zoo.nn.attention import attention_weights, dot_product_attention
from zoo.nn.block import BlockExtras, BlockInputs, BlockSettings, CrossInputs, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.dropout import Dropout
from zoo.nn.embedding import Embedder, EmbedderSettings, check_token_ids, sinusoidal_positions
from zoo.nn.feedforward import ACTIVATIONS, FeedForward, FeedForwardSettings
from zoo.nn.heads import MaskedLMHead
from zoo.nn.kernel import KernelOptions, kernel_platform
from zoo.nn.layer_index import LayerIndex
from zoo.nn.linear import Init, Linear
from zoo.nn.lora import LoRALinear
from zoo.nn.mask import Compaction, Mask
from zoo.nn.moe import MoEFeedForward, MoESettings, RouterStats
from zoo.nn.multihead import AttentionSettings, MultiHeadAttention, QKNorm
from zoo.nn.norm import LayerNorm, NormSettings, RMSNorm, make_norm
from zoo.nn.plan import LayerCall, LayerOverride, LayerPlan
from zoo.nn.quantized import QuantizedLinear
from zoo.nn.relative_position import (
    RelativePositionBias,
    RelativePositions,
    relative_position_buckets,
)
from zoo.nn.rotary import Rope, RotaryEmbedding, RotaryTable, apply_rotary
from zoo.nn.stack import LayerStack
from zoo.nn.vocab import VocabHead, vocab_multiple

__all__ = [
    "ACTIVATIONS",
    "AttentionSettings",
    "BlockExtras",
    "BlockInputs",
    "BlockSettings",
    "Compaction",
    "CrossInputs",
    "Dropout",
    "Embedder",
    "EmbedderSettings",
    "FeedForward",
    "FeedForwardSettings",
    "Init",
    "KVCache",
    "KernelOptions",
    "LayerCall",
    "LayerIndex",
    "LayerNorm",
    "LayerOverride",
    "LayerPlan",
    "LayerStack",
    "Linear",
    "LoRALinear",
    "Mask",
    "MaskedLMHead",
    "MoEFeedForward",
    "MoESettings",
    "MultiHeadAttention",
    "NormSettings",
    "QKNorm",
    "QuantizedLinear",
    "RMSNorm",
    "RelativePositionBias",
    "RelativePositions",
    "Rope",
    "RotaryEmbedding",
    "RotaryTable",
    "RouterStats",
    "TransformerBlock",
    "VocabHead",
    "apply_rotary",
    "attention_weights",
    "check_token_ids",
    "dot_product_attention",
    "kernel_platform",
    "make_norm",
    "relative_position_buckets",
    "sinusoidal_positions",
    "vocab_multiple",
]
