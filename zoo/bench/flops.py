"""Model FLOPs of one training step, for MFU.

Decoder-only and encoder-only models use the standard count (Kaplan et al. 2020; PaLM,
appendix B): a training step costs, per token,

    6 N + 12 L H Q T

where N is the number of parameters without position embeddings, L layers, H heads, Q the head
width and T the sequence length: 2 FLOPs per multiply-add, forward (2N) plus backward (4N) for
the weights, and 3 x (2 x 2 x T x H x Q) per layer for the two attention products `q k^T` and
`weights v`. The causal mask and sliding windows are not discounted, as is customary. Layers
whose heads differ (a `zoo.nn.LayerPlan`'s overrides) add their own H x Q: `L H Q` is the sum
over the layers (`attention_width`).

An encoder-decoder reads S source and T target positions per pair; each parameter works on the
positions of its own side, and attention has three kinds of products:

    6 (N_src S + N_tgt T) + 12 H Q (L_enc S^2 + L_dec T^2 + L_dec T S)

N_src: the encoder (and its final norm), the decoder's cross-attention key/value projections
(they read the encoder output) and a source-only token table; N_tgt: everything else, including
the target token table that also serves as the output projection. With S = T this is the
decoder-only count of a model with N = N_src + N_tgt and L_enc + 2 L_dec attention layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from zoo.models import TransformerConfig, TranslatorConfig
from zoo.nn.plan import LayerPlan

# Parameters that belong to the source side of an encoder-decoder (see the module docstring).
_SOURCE_PREFIXES = (".encoder", ".source_embedder")
_SOURCE_PARTS = (".cross_attention.key_proj.", ".cross_attention.value_proj.")


def decoder_flops_per_token(
    num_params: int, num_layers: int, num_heads: int, head_dim: int, seq: int
) -> int:
    """Training FLOPs per token of a decoder- or encoder-only model: `6N + 12 L H Q T`."""
    return 6 * num_params + 12 * num_layers * num_heads * head_dim * seq


def attention_width(plan: LayerPlan, d_model: int, *, cross: bool = False) -> int:
    """`L H Q` of a stack: the sum over its layers of heads times head width, of the
    self-attention (or, with `cross`, of the cross-attention)."""
    total = 0
    for settings in plan.layers():
        attention = settings.cross_attention if cross else settings.attention
        if attention is not None:
            total += attention.num_heads * attention.width(d_model)
    return total


def encoder_decoder_flops_per_pair(
    source_params: int,
    target_params: int,
    encoder_width: int,
    decoder_width: int,
    cross_width: int,
    source_len: int,
    target_len: int,
) -> int:
    """Training FLOPs of one (source, target) pair; see the module docstring.

    Args:
        source_params: parameters the source tokens pass through (embeddings excluded).
        target_params: parameters the target tokens pass through, the output head included.
        encoder_width: `L_enc H Q` of the encoder's self-attention (`attention_width`), for
            the scores over the source.
        decoder_width: `L_dec H Q` of the decoder's self-attention.
        cross_width: `L_dec H Q` of the decoder's cross-attention.
        source_len: source positions.
        target_len: target positions.
    """
    weights = 6 * (source_params * source_len + target_params * target_len)
    products = (
        encoder_width * source_len**2
        + decoder_width * target_len**2
        + cross_width * target_len * source_len
    )
    return weights + 12 * products


def _sized_leaves(model: Any) -> list[tuple[str, int]]:
    """(attribute path such as `.embedder.position_weight`, element count) of every array."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(model)
    return [
        (jax.tree_util.keystr(path), int(leaf.size))
        for path, leaf in leaves
        if hasattr(leaf, "shape")
    ]


def _is_position_table(path: str) -> bool:
    return path.endswith("position_weight")


def flop_params(model: Any) -> int:
    """N of the FLOP count: every parameter except learned position embeddings."""
    return sum(size for path, size in _sized_leaves(model) if not _is_position_table(path))


def source_target_params(model: Any) -> tuple[int, int]:
    """(N_src, N_tgt) of an encoder-decoder, position tables excluded."""
    shared = bool(getattr(model.config, "share_embeddings", False))
    source = target = 0
    for path, size in _sized_leaves(model):
        if _is_position_table(path):
            continue
        # A shared token table is the output projection too, which runs on target positions.
        shared_table = shared and path.startswith(".source_embedder.token_weight")
        on_source = not shared_table and (
            path.startswith(_SOURCE_PREFIXES) or any(part in path for part in _SOURCE_PARTS)
        )
        if on_source:
            source += size
        else:
            target += size
    return source, target


@dataclass(frozen=True)
class FlopCount:
    """Model FLOPs and token positions of one training step."""

    flops_per_step: int
    tokens_per_step: int
    params: int  # N: parameters without position embeddings

    @property
    def flops_per_token(self) -> float:
        return self.flops_per_step / self.tokens_per_step


def train_flops(model: Any, batch: int, seq: int) -> FlopCount:
    """FLOPs of a training step on `batch` sequences of `seq` positions.

    A translator reads `seq` source and `seq` target positions per pair (tokens: both).
    Works on abstract models (`zoo.presets.abstract`) as well as real ones.
    """
    config: TransformerConfig = model.config
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    width = attention_width(config.layers, config.d_model)
    if isinstance(config, TranslatorConfig):
        source, target = source_target_params(model)
        per_pair = encoder_decoder_flops_per_pair(
            source,
            target,
            width,
            attention_width(config.decoder, config.d_model),
            attention_width(config.decoder, config.d_model, cross=True),
            seq,
            seq,
        )
        return FlopCount(batch * per_pair, batch * 2 * seq, source + target)
    params = flop_params(model)
    # `6N + 12 L H Q T` with L H Q summed over the layers (one head shape: L x H x Q)
    per_token = decoder_flops_per_token(params, 1, 1, width, seq)
    return FlopCount(batch * seq * per_token, batch * seq, params)
