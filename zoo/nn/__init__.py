"""Shared per-example layers: attention, embeddings, relative positions, feed-forward, blocks,
stacks."""

from zoo.nn.attention import (
    KVCache,
    MultiHeadAttention,
    attention_weights,
    dot_product_attention,
)
from zoo.nn.block import BlockExtras, TransformerBlock
from zoo.nn.dropout import Dropout
from zoo.nn.embedding import Embedder, check_token_ids, sinusoidal_positions
from zoo.nn.feedforward import ACTIVATIONS, FeedForward
from zoo.nn.heads import MaskedLMHead
from zoo.nn.kernel import kernel_platform
from zoo.nn.linear import Linear
from zoo.nn.mask import Compaction, Mask
from zoo.nn.norm import LayerNorm, RMSNorm, make_norm
from zoo.nn.relative_position import RelativePositionBias, relative_position_buckets
from zoo.nn.rotary import RotaryEmbedding, RotaryTable, apply_rotary, rotary_inverse_frequencies
from zoo.nn.stack import LayerStack
from zoo.nn.vocab import VocabHead, vocab_multiple

__all__ = [
    "ACTIVATIONS",
    "BlockExtras",
    "Compaction",
    "Dropout",
    "Embedder",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "LayerStack",
    "Linear",
    "Mask",
    "MaskedLMHead",
    "MultiHeadAttention",
    "RMSNorm",
    "RelativePositionBias",
    "RotaryEmbedding",
    "RotaryTable",
    "TransformerBlock",
    "VocabHead",
    "apply_rotary",
    "attention_weights",
    "check_token_ids",
    "dot_product_attention",
    "kernel_platform",
    "make_norm",
    "relative_position_buckets",
    "rotary_inverse_frequencies",
    "sinusoidal_positions",
    "vocab_multiple",
]
