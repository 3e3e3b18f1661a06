"""Encoder-decoder translator ("Attention is all you need"): encode the source, decode the target.

The same class is T5 by configuration (`zoo.presets`: `t5-small`, `flan-t5-small`): RMSNorm
before each sub-layer, no biases, relative positions (`relative`: a bucketed bias on the
self-attention scores, bidirectional in the encoder and causal in the decoder, computed once
per pass and shared by the layers), unscaled scores (the attention's `scale_dim=1`), and a
tied head that rescales the decoder output by d_model^-0.5 (`head.scale`, T5 v1.0) or an
untied one (v1.1 and FLAN-T5).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.common import (
    Routed,
    check_cache_room,
    check_tokens,
    compact_padding,
    layer_stack,
    routed,
    uncompact_weights,
    valid_positions,
)
from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras, BlockInputs, BlockSettings, CrossInputs
from zoo.nn.cache import KVCache
from zoo.nn.dropout import Dropout, split_optional
from zoo.nn.embedding import Embedder, EmbedderSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.linear import Linear
from zoo.nn.mask import Compaction, Mask
from zoo.nn.multihead import AttentionSettings
from zoo.nn.norm import Norm, NormSettings
from zoo.nn.plan import LayerPlan
from zoo.nn.relative_position import RelativePositionBias, RelativePositions
from zoo.nn.stack import LayerStack
from zoo.nn.vocab import VocabHead


@dataclass(frozen=True, kw_only=True)
class TranslatorHead:
    """The projection of the decoder's features to the target vocabulary."""

    tie: bool = True  # the target token table transposed; False: a projection of its own
    bias: bool = False  # a bias on the logits (MarianMT's final_logits_bias)
    scale: bool = False  # the decoder output times d_model**-0.5 first (T5 v1.0)


def transformer_block(num_heads: int = 8, d_ff: int = 2048) -> BlockSettings:
    """The paper's encoder block: post-norm LayerNorms, a dense ReLU feed-forward, biases
    everywhere, dropout 0.1."""
    return BlockSettings(
        attention=AttentionSettings(num_heads=num_heads, dropout=0.1),
        feed_forward=FeedForwardSettings(d_ff=d_ff, activation="relu", dropout=0.1),
        norm=NormSettings(kind="layernorm", eps=1e-5),
        norm_first=False,
        dropout=0.1,
    )


def decoder_plan(encoder: LayerPlan, num_layers: int | None = None) -> LayerPlan:
    """A decoder of the encoder's blocks with cross-attention (settings of the self-attention's,
    never rotated or windowed)."""
    block = encoder.block
    cross = replace(block.attention, rope=None, window=None)
    count = encoder.num_layers if num_layers is None else num_layers
    return LayerPlan(block=replace(block, cross_attention=cross), num_layers=count)


def _paper_encoder() -> LayerPlan:
    return LayerPlan(block=transformer_block(), num_layers=6)


@dataclass(frozen=True, kw_only=True)
class TranslatorConfig(TransformerConfig):
    """A sequence-to-sequence model. The defaults are the paper's base model: `layers` is the
    encoder's plan and `decoder` the decoder's (with cross-attention)."""

    plans: ClassVar[tuple[str, ...]] = ("layers", "decoder")

    vocab_size: int = 37000  # source vocabulary (the paper: 37k shared BPE)
    max_positions: int = 1024  # longest source or target
    pad_id: int | None = 0  # padding id, in both vocabularies
    embedder: EmbedderSettings = field(  # the paper's fixed encoding, scaled embeddings
        default_factory=lambda: EmbedderSettings(positions="sinusoidal", scale=True, dropout=0.1)
    )
    layers: LayerPlan = field(default_factory=_paper_encoder)  # the encoder's blocks
    decoder: LayerPlan = field(  # the decoder's blocks, with cross-attention
        default_factory=lambda: decoder_plan(_paper_encoder())
    )
    head: TranslatorHead = field(default_factory=TranslatorHead)  # tied to the target table
    target_vocab_size: int | None = None  # target vocabulary; None: same as vocab_size
    share_embeddings: bool = True  # one token table for source and target (one vocabulary)
    bos_id: int = 1  # target token that starts decoding
    eos_id: int = 2  # target token that ends a translation
    relative: RelativePositions | None = None  # T5's relative position bias; None: none
    final_dropout: bool = False  # the blocks' dropout after the final norms too (T5); pre-norm

    def check_parts(self) -> None:
        for path, settings in self.layer_settings():
            if settings.attention.window is not None:
                self.refuse(f"{path}.attention.window", "is not used: a translator has no window")
            decoder = path.startswith("decoder")
            if decoder and settings.cross_attention is None:
                self.refuse(
                    f"{path}.cross_attention", "is None: a decoder layer attends to the source"
                )
            if not decoder and settings.cross_attention is not None:
                self.refuse(f"{path}.cross_attention", "is set: an encoder layer has none")
        if self.relative is not None and self.embedder.positions != "none":
            self.refuse(
                "relative",
                f"adds relative positions, but the embedder adds {self.embedder.positions} ones "
                "too: set embedder.positions='none'",
            )
        if self.embedder.type_vocab_size or self.embedder.position_offset:
            self.refuse(
                "embedder", "has token types or a position offset, which only a classifier reads"
            )
        if self.final_dropout and not self.layers.block.norm_first:
            raise ValueError(
                "final_dropout applies dropout after the final norms, which only a pre-norm "
                "model has: set norm_first=True or final_dropout=False"
            )
        if self.target_vocab_size is not None and self.target_vocab_size <= 0:
            raise ValueError(f"target_vocab_size must be positive, got {self.target_vocab_size}")
        if self.share_embeddings and self.tgt_vocab != self.vocab_size:
            raise ValueError(
                f"share_embeddings needs one vocabulary, but vocab_size={self.vocab_size} and "
                f"target_vocab_size={self.tgt_vocab}; set share_embeddings=False"
            )
        for name in ("bos_id", "eos_id", "pad_id"):
            self._check_token_id(name, getattr(self, name), self.tgt_vocab)

    def relative_bias(
        self, *, bidirectional: bool, key: PRNGKeyArray
    ) -> RelativePositionBias | None:
        """The relative position table of one side, or None without relative positions."""
        if self.relative is None:
            return None
        return RelativePositionBias(
            self.num_heads,
            bidirectional=bidirectional,
            num_buckets=self.relative.num_buckets,
            max_distance=self.relative.max_distance,
            init=self.init,
            key=key,
        )

    @property
    def tgt_vocab(self) -> int:
        """Size of the target vocabulary."""
        return self.vocab_size if self.target_vocab_size is None else self.target_vocab_size

    @property
    def decoder_layers(self) -> int:
        """Number of decoder blocks."""
        return self.decoder.num_layers


class TranslatorState(eqx.Module):
    """Everything incremental decoding needs about one source: cross keys/values and the cache.

    The cross keys/values are those of the source's real tokens first (`zoo.nn.Compaction`);
    `source_length` of them are real.
    """

    cross_keys: Float[Array, "layers src kv_heads head_dim"]
    cross_values: Float[Array, "layers src kv_heads head_dim"]
    source_length: Int[Array, ""]
    cache: KVCache


class EncodedSource(NamedTuple):
    """The encoder's output for one source, real tokens first, and how to put it back."""

    memory: Float[Array, "src d_model"]
    length: Int[Array, ""] | None  # real tokens at the front of `memory`; None: all are real
    compaction: Compaction | None  # None when nothing was moved

    def cross_mask(self) -> Mask:
        """The cross-attention's mask: the source's real tokens."""
        return Mask() if self.length is None else Mask(key_length=self.length)

    def in_order(self) -> Float[Array, "src d_model"]:
        """The memory in the source's own order."""
        return self.memory if self.compaction is None else self.compaction.scatter(self.memory)


class Translator(eqx.Module):
    """Encoder-decoder for one pair: `(Int["src"], Int["tgt"]) -> Float["tgt vocab"]`.

    Teacher-forced: `tgt` starts with `bos_id` and logits at position i predict token i+1.
    Batch with `jax.vmap`. Called without a key the model is deterministic (no dropout).
    """

    config: TranslatorConfig = eqx.field(static=True)
    source_embedder: Embedder
    target_embedder: Embedder
    encoder: LayerStack
    encoder_norm: Norm | None
    decoder: LayerStack
    decoder_norm: Norm | None
    output_proj: Linear | None
    output_bias: Float[Array, " vocab"] | None
    encoder_position_bias: RelativePositionBias | None
    decoder_position_bias: RelativePositionBias | None
    final_dropout: Dropout

    def __init__(self, config: TranslatorConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, 5)
        c = config
        self.config = c
        self.source_embedder = Embedder(
            c.vocab_size, c.d_model, c.max_positions, c.embedder, init=c.init, key=keys[0]
        )
        self.target_embedder = Embedder(
            c.tgt_vocab,
            c.d_model,
            c.max_positions,
            c.embedder,
            own_tokens=not c.share_embeddings,
            init=c.init,
            key=keys[1],
        )
        self.encoder = layer_stack(c, c.layers, key=keys[2])
        self.decoder = layer_stack(c, c.decoder, key=keys[3])
        self.encoder_norm = c.make_norm() if c.layers.block.norm_first else None
        self.decoder_norm = c.make_norm() if c.decoder.block.norm_first else None
        self.output_proj = (
            None if c.head.tie else c.init.linear(c.d_model, c.tgt_vocab, False, key=keys[4])
        )
        self.output_bias = jnp.zeros((c.tgt_vocab,), c.param_dtype) if c.head.bias else None
        # relative positions: one table per side (T5 keeps it in the first layer), shared by
        # every layer of that side
        self.encoder_position_bias = c.relative_bias(
            bidirectional=True, key=jax.random.fold_in(key, 5)
        )
        self.decoder_position_bias = c.relative_bias(
            bidirectional=False, key=jax.random.fold_in(key, 6)
        )
        self.final_dropout = Dropout(c.layers.block.dropout if c.final_dropout else 0.0)

    @property
    def target_token_weight(self) -> Float[Array, "vocab d_model"]:
        """The target token table (the source's when embeddings are shared)."""
        table = self.target_embedder.token_weight
        if table is None:
            table = self.source_embedder.token_weight
        assert table is not None
        return table

    # ---------------------------------------------------------------- encoder

    def _encode(self, src, src_mask, *, key, return_weights=False):
        c = self.config
        src = check_tokens(src, vocab_size=c.vocab_size, max_positions=c.max_positions, name="src")
        embed_key, layers_key = split_optional(key, 2)
        positions = jnp.arange(src.shape[0])
        valid = valid_positions(src, c.pad_id, src_mask)
        # real tokens first, so that the padding is a length (zoo.nn.Compaction); the memory
        # stays in that order (`EncodedSource`)
        compaction, attention, src, positions, _ = compact_padding(valid, Mask(), src, positions)
        x = self.source_embedder(src, positions, key=embed_key)
        score_bias = None
        if self.encoder_position_bias is not None:
            score_bias = self.encoder_position_bias(positions, positions)
        inputs = BlockInputs(mask=attention, positions=positions, score_bias=score_bias)
        x, extras = self.encoder(x, inputs, key=layers_key, return_weights=return_weights)
        memory = self._finish(self.encoder_norm, x, layers_key)
        length = None if compaction is None else compaction.length
        extras = extras._replace(self_weights=uncompact_weights(extras.self_weights, compaction))
        return EncodedSource(memory, length, compaction), extras

    def _finish(self, norm: Norm | None, x: Array, key: PRNGKeyArray | None) -> Array:
        """A stack's final norm, then (T5) dropout on its output."""
        if norm is not None:
            x = norm(x)
        if key is None:
            return x
        return self.final_dropout(x, key=jax.random.fold_in(key, 1))

    def encode(
        self,
        src: Int[Array, " src"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "src d_model"]:
        """Encoder output (the memory the decoder attends to)."""
        source, _ = self._encode(src, src_mask, key=key)
        return source.in_order()

    # ---------------------------------------------------------------- decoder

    def _decode(
        self,
        tgt: Array,
        cross: CrossInputs,
        *,
        key: PRNGKeyArray | None,
        cache: KVCache | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "tgt d_model"], BlockExtras]:
        c = self.config
        tgt = check_tokens(tgt, vocab_size=c.tgt_vocab, max_positions=c.max_positions, name="tgt")
        embed_key, layers_key = split_optional(key, 2)
        num_tgt = tgt.shape[0]
        index = jnp.zeros((), jnp.int32) if cache is None else cache.index
        x = self.target_embedder(
            tgt, index + jnp.arange(num_tgt), token_weight=self.target_token_weight, key=embed_key
        )
        # Targets are right-padded and attention is causal, so real positions never see padding
        # (and a bos_id equal to pad_id, as in MarianMT, stays visible).
        self_mask = Mask(causal=True, offset=None if cache is None else index)
        num_keys = num_tgt if cache is None else cache.capacity
        score_bias = None
        if self.decoder_position_bias is not None:
            # queries sit at their absolute positions: after the cached ones when decoding
            score_bias = self.decoder_position_bias(
                index + jnp.arange(num_tgt), jnp.arange(num_keys)
            )
        inputs = BlockInputs(mask=self_mask, score_bias=score_bias, cross=cross, cache=cache)
        x, extras = self.decoder(x, inputs, key=layers_key, return_weights=return_weights)
        return self._finish(self.decoder_norm, x, layers_key), extras

    @property
    def output_head(self) -> VocabHead:
        """The projection of decoder features to the target vocabulary: the target table
        (tied) or `output_proj`, MarianMT's logits bias, T5 v1.0's rescaling."""
        layer = self.target_token_weight if self.output_proj is None else self.output_proj
        scale = self.config.d_model**-0.5 if self.config.head.scale else None
        return VocabHead(layer, bias=self.output_bias, scale=scale)

    def decode(
        self,
        tgt: Int[Array, " tgt"],
        memory: Float[Array, "src d_model"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "tgt vocab"]:
        """Teacher-forced decoder logits given the encoder memory.

        `src_mask` marks real source positions (derive it from the source with `pad_id`); without
        it every memory position is attended to.
        """
        source = EncodedSource(memory, None, None)
        if src_mask is not None:
            compaction = Compaction.of(src_mask.astype(bool))
            source = EncodedSource(compaction.gather(memory), compaction.length, compaction)
        cross = self.decoder.cross_inputs(source.memory, source.cross_mask())
        x, _ = self._decode(tgt, cross, key=key)
        return self.output_head(x)

    def __call__(
        self,
        src: Int[Array, " src"],
        tgt: Int[Array, " tgt"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "tgt vocab"]:
        """Teacher-forced logits: position i of `tgt` predicts token i+1."""
        return self.output_head(self.features(src, tgt, src_mask, key=key))

    def features(
        self,
        src: Int[Array, " src"],
        tgt: Int[Array, " tgt"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "tgt d_model"]:
        """The decoder's output, what `output_head` turns into the logits:
        `model(src, tgt) == model.output_head(model.features(src, tgt))`."""
        return self.features_and_router(src, tgt, src_mask, key=key).output

    def features_and_router(
        self,
        src: Int[Array, " src"],
        tgt: Int[Array, " tgt"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed:
        """`features` and, for a mixture of experts, the routers' statistics of the encoder
        and the decoder pooled (`Routed`): what `zoo.tasks.Translation` forms its router losses
        from."""
        encode_key, decode_key = split_optional(key, 2)
        source, encoded = self._encode(src, src_mask, key=encode_key)
        cross = self.decoder.cross_inputs(source.memory, source.cross_mask())
        x, decoded = self._decode(tgt, cross, key=decode_key)
        return routed(x, encoded, decoded)

    def attention_maps(
        self, src: Int[Array, " src"], tgt: Int[Array, " tgt"]
    ) -> dict[str, Float[Array, "layers heads q k"]]:
        """Weights per layer and head: `encoder` [src, src], `decoder` [tgt, tgt], `cross` [tgt, src]."""
        source, enc = self._encode(src, None, key=None, return_weights=True)
        inputs = self.decoder.cross_inputs(source.memory, source.cross_mask())
        _, dec = self._decode(tgt, inputs, key=None, return_weights=True)
        cross = dec.cross_weights
        if source.compaction is not None and cross is not None:
            cross = source.compaction.scatter(cross, axis=-1)
        return {"encoder": enc.self_weights, "decoder": dec.self_weights, "cross": cross}

    # ---------------------------------------------------------------- incremental decoding

    def start_decoding(
        self,
        src: Int[Array, " src"],
        max_len: int,
        src_mask: Bool[Array, " src"] | None = None,
    ) -> TranslatorState:
        """Encode `src` once, compute every layer's cross keys/values, allocate the cache."""
        if max_len > self.config.max_positions:
            raise ValueError(f"max_len={max_len} exceeds max_positions={self.config.max_positions}")
        source, _ = self._encode(src, src_mask, key=None)
        cross_keys, cross_values, _ = self.decoder.cross_inputs(source.memory)
        cache = self.decoder.init_cache(max_len, source.memory.dtype)
        length = jnp.asarray(src.shape[0] if source.length is None else source.length, jnp.int32)
        return TranslatorState(cross_keys, cross_values, length, cache)

    def decode_step(
        self, tgt: Int[Array, " seq"], state: TranslatorState
    ) -> tuple[Float[Array, "seq vocab"], TranslatorState]:
        """Feed target tokens after those already cached; returns their logits and the new state."""
        cache = check_cache_room(state.cache, tgt.shape[0], self.config.max_positions)
        cross = CrossInputs(
            state.cross_keys, state.cross_values, Mask(key_length=state.source_length)
        )
        x, extras = self._decode(tgt, cross, key=None, cache=cache)
        assert extras.cache is not None
        new_cache = extras.cache.advance(tgt.shape[0])
        return self.output_head(x), TranslatorState(
            state.cross_keys, state.cross_values, state.source_length, new_cache
        )
