"""Encoder-only classifier (BERT-like): embeddings -> encoder blocks -> pooling -> class logits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.common import (
    Routed,
    check_tokens,
    compact_padding,
    layer_stack,
    restore_order,
    routed,
    valid_positions,
)
from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras, BlockInputs, BlockSettings
from zoo.nn.dropout import Dropout, split_optional
from zoo.nn.embedding import Embedder, EmbedderSettings, check_token_ids
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.heads import MaskedLMHead
from zoo.nn.linear import Linear
from zoo.nn.mask import Mask
from zoo.nn.multihead import AttentionSettings
from zoo.nn.norm import Norm, NormSettings
from zoo.nn.plan import LayerPlan
from zoo.nn.stack import LayerStack

POOLINGS = ("first", "mean")
# the pooler's nonlinearity: BERT's pooler and RoBERTa's head use tanh, DistilBERT's head relu,
# ModernBERT's head exact GELU
POOLER_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


@dataclass(frozen=True, kw_only=True)
class Pooler:
    """A dense layer and its nonlinearity on the pooled vector (BERT's pooler)."""

    activation: str = "tanh"  # tanh (BERT, RoBERTa) | relu (DistilBERT) | gelu (ModernBERT)
    bias: bool = True  # the dense layer's bias (ModernBERT's head: classifier_bias)
    norm: bool = False  # a norm after the activation (ModernBERT's head.norm)

    def __post_init__(self) -> None:
        if self.activation not in POOLER_ACTIVATIONS:
            raise ValueError(
                f"pooler activation must be one of {sorted(POOLER_ACTIVATIONS)}, "
                f"got {self.activation!r}"
            )


@dataclass(frozen=True, kw_only=True)
class ClassifierHead:
    """How a classifier turns the encoder's output into class logits."""

    num_classes: int = 2  # labels in [0, num_classes)
    pooling: str = "first"  # first: the first token ([CLS]); mean: mean over real tokens
    pooler: Pooler | None = field(default_factory=Pooler)  # None: the pooled vector as it is
    dropout: float = 0.1  # before the class projection

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int) or isinstance(self.num_classes, bool):
            raise ValueError(f"num_classes must be a positive integer, got {self.num_classes!r}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {self.num_classes!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"head dropout must be in [0, 1), got {self.dropout}")


def bert_plan(num_heads: int = 12, d_ff: int = 3072, num_layers: int = 12) -> LayerPlan:
    """BERT's blocks: post-norm LayerNorms (eps 1e-12), a dense exact-GELU feed-forward,
    biases everywhere, dropout 0.1."""
    block = BlockSettings(
        attention=AttentionSettings(num_heads=num_heads, dropout=0.1),
        feed_forward=FeedForwardSettings(d_ff=d_ff, activation="gelu", dropout=0.1),
        norm=NormSettings(kind="layernorm", eps=1e-12),
        norm_first=False,
        dropout=0.1,
    )
    return LayerPlan(block=block, num_layers=num_layers)


def bert_embedder() -> EmbedderSettings:
    """BERT's embeddings: learned positions, two token types, a LayerNorm, dropout 0.1."""
    return EmbedderSettings(
        positions="learned",
        type_vocab_size=2,
        norm=NormSettings(kind="layernorm", eps=1e-12),
        dropout=0.1,
    )


@dataclass(frozen=True, kw_only=True)
class ClassifierConfig(TransformerConfig):
    """A sequence classifier. The defaults are BERT-base (uncased) shapes."""

    aliases: ClassVar[dict[str, tuple[str, ...]]] = {
        **TransformerConfig.aliases,
        "num_classes": ("head.num_classes",),
    }

    vocab_size: int = 30522  # BERT uncased WordPiece vocabulary
    d_model: int = 768  # model width
    max_positions: int = 512  # longest input (RoBERTa: with its position offset)
    pad_id: int | None = 0  # [PAD]
    embedder: EmbedderSettings = field(default_factory=bert_embedder)  # BERT's
    layers: LayerPlan = field(default_factory=bert_plan)  # 12 post-norm blocks
    head: ClassifierHead = field(default_factory=ClassifierHead)  # [CLS] -> pooler -> classes
    masked_lm: bool = False  # add the masked-LM head (tied decoder) for MLM pretraining
    mask_id: int | None = None  # the mask token of masked-LM pretraining ([MASK], <mask>)

    def check_parts(self) -> None:
        offset = self.embedder.position_offset
        if not 0 <= offset < self.max_positions:
            raise ValueError(
                f"embedder.position_offset must be in [0, max_positions={self.max_positions}), "
                f"got {offset}; RoBERTa uses pad_id + 1 with max_positions = longest input + "
                "pad_id + 1"
            )
        self._check_token_id("mask_id", self.mask_id)
        for path, settings in self.layer_settings():
            if settings.cross_attention is not None:
                self.refuse(f"{path}.cross_attention", "is a translator decoder's")

    @property
    def num_classes(self) -> int:
        """Labels the head scores."""
        return self.head.num_classes

    @property
    def max_tokens(self) -> int:
        """The longest input: `max_positions` less the positions RoBERTa's offset skips."""
        return self.max_positions - self.embedder.position_offset


class Classifier(eqx.Module):
    """Encoder classifier for one sequence: `Int[Array, "seq"] -> Float[Array, "classes"]`.

    Batch with `jax.vmap`. Called without a key the model is deterministic (no dropout).
    """

    config: ClassifierConfig = eqx.field(static=True)
    embedder: Embedder
    encoder: LayerStack
    final_norm: Norm | None
    pooler: Linear | None
    pooler_norm: Norm | None
    head_dropout: Dropout
    head: Linear
    mlm_head: MaskedLMHead | None

    def __init__(self, config: ClassifierConfig, *, key: PRNGKeyArray):
        embed_key, layers_key, pooler_key, head_key, mlm_key = jax.random.split(key, 5)
        c, head = config, config.head
        self.config = c
        self.embedder = Embedder(
            c.vocab_size, c.d_model, c.max_positions, c.embedder, init=c.init, key=embed_key
        )
        self.encoder = layer_stack(c, c.layers, key=layers_key)
        self.final_norm = c.make_norm() if c.layers.block.norm_first else None
        pooler = head.pooler
        self.pooler = None
        if pooler is not None:
            self.pooler = c.init.linear(c.d_model, c.d_model, pooler.bias, key=pooler_key)
        self.pooler_norm = c.make_norm() if pooler is not None and pooler.norm else None
        self.head_dropout = Dropout(head.dropout)
        self.head = c.init.linear(c.d_model, head.num_classes, key=head_key)
        self.mlm_head = None
        if c.masked_lm:
            self.mlm_head = MaskedLMHead(
                c.d_model,
                c.vocab_size,
                activation=_mlm_activation(c),
                eps=c.layers.block.norm.eps,
                init=c.init,
                key=mlm_key,
            )

    def _encode(
        self,
        tokens: Array,
        mask: Bool[Array, " seq"] | None,
        token_types: Int[Array, " seq"] | None,
        *,
        key: PRNGKeyArray | None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], Bool[Array, " seq"] | None, BlockExtras]:
        c = self.config
        tokens = check_tokens(tokens, vocab_size=c.vocab_size, max_positions=c.max_tokens)
        if token_types is not None:
            if token_types.shape != tokens.shape:
                raise ValueError(
                    f"token_types must have the tokens' shape {tuple(tokens.shape)}, "
                    f"got {tuple(token_types.shape)}"
                )
            if c.embedder.type_vocab_size == 0:
                raise ValueError("token_types given but the config has type_vocab_size=0")
            types = c.embedder.type_vocab_size
            token_types = check_token_ids(token_types, types, what="token type")
        embed_key, layers_key = split_optional(key, 2)
        num_tokens = tokens.shape[0]
        valid = valid_positions(tokens, c.pad_id, mask)
        positions = jnp.arange(num_tokens)
        offset = c.embedder.position_offset
        if offset > 0 and valid is not None:
            # RoBERTa: real tokens count from pad_id + 1, padding sits at pad_id (one below)
            counts = jnp.cumsum(valid.astype(jnp.int32))
            positions = jnp.where(valid, counts, 0) + (offset - 1)
        elif offset > 0:
            positions = positions + offset
        # real tokens first, so that the padding is a length (zoo.nn.Compaction)
        # a layer's window in an encoder is two-sided (ModernBERT's local layers); it counts
        # compacted positions, which are the tokens' own wherever the padding is at the end
        compaction, attention, tokens, positions, token_types = compact_padding(
            valid, Mask(), tokens, positions, token_types
        )
        x = self.embedder(tokens, positions, token_types, key=embed_key)
        inputs = BlockInputs(mask=attention, positions=positions)
        x, extras = self.encoder(x, inputs, key=layers_key, return_weights=return_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        x, extras = restore_order(compaction, x, extras)
        return x, valid, extras

    def encode(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq d_model"]:
        """Contextual vectors of every position."""
        hidden, _, _ = self._encode(tokens, mask, token_types, key=key)
        return hidden

    def pool(
        self, hidden: Float[Array, "seq d_model"], valid: Bool[Array, " seq"] | None
    ) -> Float[Array, " d_model"]:
        """One vector per sequence: the first token's, or the mean over real tokens."""
        head = self.config.head
        if head.pooling == "first":
            pooled = hidden[0]
        else:
            weights = (
                jnp.ones(hidden.shape[0], hidden.dtype)
                if valid is None
                else valid.astype(hidden.dtype)
            )
            total = jnp.sum(hidden * weights[:, None], axis=0)
            pooled = total / jnp.maximum(jnp.sum(weights), 1.0)
        if self.pooler is not None:
            assert head.pooler is not None
            pooled = POOLER_ACTIVATIONS[head.pooler.activation](self.pooler(pooled))
        if self.pooler_norm is not None:
            pooled = self.pooler_norm(pooled)
        return pooled

    def __call__(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " classes"]:
        """Class logits. `mask` (True = real token) overrides padding derived from `pad_id`."""
        return self.logits_and_router(tokens, mask, token_types, key=key).output

    def logits_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed:
        """The class logits and, for a mixture of experts, its routers' statistics (`Routed`):
        what `zoo.tasks.Classification` forms its loss and router losses from."""
        encode_key, head_key = split_optional(key, 2)
        hidden, valid, extras = self._encode(tokens, mask, token_types, key=encode_key)
        pooled = self.head_dropout(self.pool(hidden, valid), key=head_key)
        return routed(self.head(pooled), extras)

    def masked_lm_logits(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq vocab"]:
        """Vocabulary logits at every position from the masked-LM head (`masked_lm=True`)."""
        return self.masked_lm_logits_and_router(tokens, mask, token_types, key=key).output

    def masked_lm_logits_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed:
        """`masked_lm_logits` and the routers' statistics (`Routed`)."""
        if self.mlm_head is None:
            raise ValueError(
                "this classifier has no masked-LM head: build it with masked_lm=True "
                "(zoo.create(..., masked_lm=True)) to pretrain or score masked tokens"
            )
        hidden, _, extras = self._encode(tokens, mask, token_types, key=key)
        assert self.embedder.token_weight is not None  # a classifier owns its token table
        return routed(self.mlm_head(hidden, self.embedder.token_weight), extras)

    def attention_maps(
        self, tokens: Int[Array, " seq"], mask: Bool[Array, " seq"] | None = None
    ) -> Float[Array, "layers heads seq seq"]:
        """Attention weights of every layer and head (inference mode, no dropout)."""
        _, _, extras = self._encode(tokens, mask, None, key=None, return_weights=True)
        assert extras.self_weights is not None
        return extras.self_weights


def _mlm_activation(config: ClassifierConfig) -> str:
    """The masked-LM head's activation: the feed-forward's (BERT: exact GELU)."""
    return config.layers.block.feed_forward.activation
