"""Encoder-only classifier (BERT-like): embeddings -> encoder blocks -> pooling -> class logits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.common import (
    check_tokens,
    compact_padding,
    layer_stack,
    restore_order,
    valid_positions,
)
from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras, BlockInputs
from zoo.nn.dropout import Dropout, split_optional
from zoo.nn.embedding import Embedder, EmbedderSettings, check_token_ids
from zoo.nn.heads import MaskedLMHead
from zoo.nn.linear import Linear
from zoo.nn.mask import Mask
from zoo.nn.norm import Norm
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
class ClassifierConfig(TransformerConfig):
    """A sequence classifier. The defaults are BERT-base (uncased) shapes."""

    vocab_size: int = 30522  # BERT uncased WordPiece vocabulary
    d_model: int = 768  # model width
    num_heads: int = 12  # attention heads
    num_layers: int = 12  # encoder blocks
    d_ff: int = 3072  # feed-forward width
    max_positions: int = 512  # longest input
    pad_id: int | None = 0  # [PAD]
    num_classes: int = 2  # labels in [0, num_classes)
    pooling: str = "first"  # first: the first token ([CLS]); mean: mean over non-pad tokens
    pooler: bool = True  # dense + tanh on the pooled vector (BERT's pooler)
    pooler_activation: str = "tanh"  # tanh (BERT, RoBERTa) | relu (DistilBERT) | gelu (ModernBERT)
    pooler_bias: bool = True  # the pooler's dense bias (ModernBERT's head: classifier_bias)
    pooler_norm: bool = False  # a norm after the pooler's activation (ModernBERT's head.norm)
    position_offset: int = 0  # RoBERTa: pad_id + 1; > 0: positions count real tokens from here
    masked_lm: bool = False  # add the masked-LM head (tied decoder) for MLM pretraining
    mask_id: int | None = None  # the mask token of masked-LM pretraining ([MASK], <mask>)
    type_vocab_size: int = 2  # token-type (segment) embeddings; 0 disables them
    classifier_dropout: float | None = None  # dropout before the class head (None: `dropout`)
    norm_first: bool = False  # BERT is post-LN
    embedding_norm: bool = True  # BERT normalises the embeddings
    layer_norm_eps: float = 1e-12  # BERT's LayerNorm epsilon
    activation: str = "gelu"  # exact (erf) GELU

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {self.num_classes!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.pooler_activation not in POOLER_ACTIVATIONS:
            raise ValueError(
                f"pooler_activation must be one of {sorted(POOLER_ACTIVATIONS)}, "
                f"got {self.pooler_activation!r}"
            )
        if not 0 <= self.position_offset < self.max_positions:
            raise ValueError(
                f"position_offset must be in [0, max_positions={self.max_positions}), got "
                f"{self.position_offset}; RoBERTa uses pad_id + 1 with max_positions = longest "
                "input + pad_id + 1"
            )
        self._check_token_id("mask_id", self.mask_id)
        rate = self.classifier_dropout
        if rate is not None and not 0.0 <= rate < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1), got {rate}")
        if self.pooler_norm and not self.pooler:
            raise ValueError("pooler_norm normalises the pooler's output: set pooler=True")

    def embedder_settings(self) -> EmbedderSettings:
        """The embedder's settings, with the token types (segments) of `type_vocab_size`."""
        return replace(super().embedder_settings(), type_vocab_size=self.type_vocab_size)

    @property
    def max_tokens(self) -> int:
        """The longest input: `max_positions` less the positions RoBERTa's offset skips."""
        return self.max_positions - self.position_offset


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
        c = config
        self.config = c
        self.embedder = Embedder(c.d_model, c.embedder_settings(), init=c.init, key=embed_key)
        self.encoder = layer_stack(c, c.num_layers, key=layers_key)
        self.final_norm = c.make_norm() if c.norm_first else None
        self.pooler = None
        if c.pooler:
            self.pooler = c.init.linear(c.d_model, c.d_model, c.pooler_bias, key=pooler_key)
        self.pooler_norm = c.make_norm() if c.pooler_norm else None
        rate = c.dropout if c.classifier_dropout is None else c.classifier_dropout
        self.head_dropout = Dropout(rate)
        self.head = c.init.linear(c.d_model, c.num_classes, key=head_key)
        self.mlm_head = None
        if c.masked_lm:
            self.mlm_head = MaskedLMHead(
                c.d_model,
                c.vocab_size,
                activation=c.activation,
                eps=c.layer_norm_eps,
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
            if c.type_vocab_size == 0:
                raise ValueError("token_types given but the config has type_vocab_size=0")
            token_types = check_token_ids(token_types, c.type_vocab_size, what="token type")
        embed_key, layers_key = split_optional(key, 2)
        num_tokens = tokens.shape[0]
        valid = valid_positions(tokens, c.pad_id, mask)
        positions = jnp.arange(num_tokens)
        if c.position_offset > 0 and valid is not None:
            # RoBERTa: real tokens count from pad_id + 1, padding sits at pad_id (one below)
            counts = jnp.cumsum(valid.astype(jnp.int32))
            positions = jnp.where(valid, counts, 0) + (c.position_offset - 1)
        elif c.position_offset > 0:
            positions = positions + c.position_offset
        # real tokens first, so that the padding is a length (zoo.nn.Compaction)
        # a window in an encoder is two-sided (ModernBERT's local layers); it counts compacted
        # positions, which are the tokens' own wherever the padding is at the end
        compaction, attention, tokens, positions, token_types = compact_padding(
            valid, Mask(window=c.sliding_window), tokens, positions, token_types
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
        if self.config.pooling == "first":
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
            pooled = POOLER_ACTIVATIONS[self.config.pooler_activation](self.pooler(pooled))
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
        encode_key, head_key = split_optional(key, 2)
        hidden, valid, _ = self._encode(tokens, mask, token_types, key=encode_key)
        pooled = self.head_dropout(self.pool(hidden, valid), key=head_key)
        return self.head(pooled)

    def masked_lm_logits(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq vocab"]:
        """Vocabulary logits at every position from the masked-LM head (`masked_lm=True`)."""
        if self.mlm_head is None:
            raise ValueError(
                "this classifier has no masked-LM head: build it with masked_lm=True "
                "(zoo.create(..., masked_lm=True)) to pretrain or score masked tokens"
            )
        hidden, _, _ = self._encode(tokens, mask, token_types, key=key)
        assert self.embedder.token_weight is not None  # a classifier owns its token table
        return self.mlm_head(hidden, self.embedder.token_weight)

    def attention_maps(
        self, tokens: Int[Array, " seq"], mask: Bool[Array, " seq"] | None = None
    ) -> Float[Array, "layers heads seq seq"]:
        """Attention weights of every layer and head (inference mode, no dropout)."""
        _, _, extras = self._encode(tokens, mask, None, key=None, return_weights=True)
        assert extras.self_weights is not None
        return extras.self_weights
