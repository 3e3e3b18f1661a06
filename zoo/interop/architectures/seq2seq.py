"""What the encoder-decoder families (T5, MarianMT) need of a translator's tree to export it.

Their configs give one setting for every layer of both stacks: one number of heads, one
feed-forward width, one norm; the decoder's cross-attention is its self-attention's kind. A
zoo translator's tree can say more (an encoder and a decoder plan, each with overrides, and a
cross-attention record of its own): `shared_block` refuses what these families cannot say and
returns the one block they write. Dropout rates differ only in training, so they are compared
by each family, which warns where it writes fewer rates than the model has.
"""

from __future__ import annotations

import dataclasses

from zoo.interop.architecture import UnsupportedExport, refuse_layer_overrides
from zoo.models import TranslatorConfig
from zoo.nn.block import BlockSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.multihead import AttentionSettings


def _attention_computation(attention: AttentionSettings) -> AttentionSettings:
    """`attention` without what only training or the kernel choice reads."""
    return dataclasses.replace(attention, dropout=0.0, implementation=None)


def _block_computation(block: BlockSettings) -> BlockSettings:
    """`block` without its dropout rates and kernel choices (inference is the same)."""
    feed_forward = block.feed_forward
    if isinstance(feed_forward, FeedForwardSettings):
        feed_forward = dataclasses.replace(feed_forward, dropout=0.0)
    cross = block.cross_attention
    return dataclasses.replace(
        block,
        attention=_attention_computation(block.attention),
        feed_forward=feed_forward,
        cross_attention=None if cross is None else _attention_computation(cross),
        dropout=0.0,
    )


def differences(ours: object, theirs: object, path: str = "") -> list[str]:
    """The dotted paths where two settings records differ (`attention.num_heads`)."""
    same_kind = type(ours) is type(theirs)
    if not (same_kind and dataclasses.is_dataclass(ours) and not isinstance(ours, type)):
        return [] if ours == theirs else [path]
    found = []
    for field in dataclasses.fields(ours):
        inner = f"{path}.{field.name}" if path else field.name
        found += differences(getattr(ours, field.name), getattr(theirs, field.name), inner)
    return found


def shared_block(config: TranslatorConfig, target: str) -> BlockSettings:
    """The block settings every layer of both stacks has (the encoder's base block).

    Refused: layers that differ (`layers.overrides`, `decoder.overrides`), encoder and decoder
    blocks that differ beyond the decoder's cross-attention, a cross-attention whose settings
    are not the self-attention's, a mixture of experts (dropout rates aside)."""
    refuse_layer_overrides(config, target)
    encoder, decoder = config.layers.block, config.decoder.block
    if not isinstance(encoder.feed_forward, FeedForwardSettings):
        raise UnsupportedExport(
            f"{target} cannot express this zoo model: its feed-forward layers are dense, but "
            "layers.block.feed_forward is a mixture of experts"
        )
    stacks = differences(
        _block_computation(dataclasses.replace(decoder, cross_attention=None)),
        _block_computation(encoder),
    )
    if stacks:
        raise UnsupportedExport(
            f"{target} cannot express this zoo model: its config has one setting for the "
            "encoder and the decoder, but the blocks differ in "
            + ", ".join(f"layers.block.{p} / decoder.block.{p}" for p in stacks)
        )
    cross = decoder.cross_attention
    # a cross-attention is never rotated or windowed: the self-attention's rope and window
    # are the family's to refuse
    self_attention = _attention_computation(
        dataclasses.replace(encoder.attention, rope=None, window=None)
    )
    if cross is None:
        raise UnsupportedExport(f"{target} cannot express a decoder without cross-attention")
    crossed = differences(_attention_computation(cross), self_attention)
    if crossed:
        raise UnsupportedExport(
            f"{target} cannot express this zoo model: its cross-attention has the "
            "self-attention's settings, but they differ in "
            + ", ".join(f"decoder.block.cross_attention.{p}" for p in crossed)
        )
    return encoder
