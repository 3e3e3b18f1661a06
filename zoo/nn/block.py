"""One transformer layer: self-attention, optional cross-attention, feed-forward.

An encoder block is a `TransformerBlock` without cross-attention run with a padding mask; a
decoder block runs with a causal mask and, in a translator, cross-attends to the encoder memory.
The norm (LayerNorm or RMSNorm) sits before each sub-layer (`norm_first=True`, GPT-2, Llama)
or after the residual sum (`norm_first=False`, the original Transformer and BERT). With
`output_norm` a norm also sits on each sub-layer's output, before the residual sum: after a
norm before it ("sandwich", Gemma 2/3: `x + norm_out(f(norm_in(x)))`), or alone (OLMo 2:
`x + norm(f(x))`, where the block's one norm per sub-layer is this output norm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.cache import KVCache
from zoo.nn.dropout import Dropout, split_optional
from zoo.nn.feedforward import FeedForward, FeedForwardSettings
from zoo.nn.linear import Init
from zoo.nn.mask import Mask
from zoo.nn.moe import MoEFeedForward, MoESettings, RouterStats
from zoo.nn.multihead import AttentionSettings, MultiHeadAttention
from zoo.nn.norm import Norm, NormSettings
from zoo.nn.rotary import Rope, RotaryTable
from zoo.tree import with_fields


@dataclass(frozen=True, kw_only=True)
class BlockSettings:
    """What a `TransformerBlock` is, besides its width and initialisation: its parts' own
    settings, the norm, and where the norm sits."""

    attention: AttentionSettings = field(default_factory=AttentionSettings)  # self-attention
    feed_forward: FeedForwardSettings | MoESettings = field(  # dense/gated, or experts
        default_factory=FeedForwardSettings
    )
    cross_attention: AttentionSettings | None = None  # a decoder's, attending to the encoder
    norm: NormSettings = field(default_factory=NormSettings)  # the block's norms
    norm_first: bool = True  # pre-norm (GPT-2, Llama) or post-norm (the paper, BERT)
    dropout: float = 0.0  # on each sub-layer's output, before the residual sum
    output_norm: bool = False  # norm each sub-layer's output before the sum (Gemma 2/3, OLMo 2)
    attention_norm: bool = True  # False: no norm before the attention (ModernBERT's layer 0)

    def __post_init__(self) -> None:
        cross = self.cross_attention
        if cross is not None and (cross.rope is not None or cross.window is not None):
            raise ValueError(
                "cross-attention keys are not rotated or windowed: give it rope=None, window=None"
            )
        if cross is not None and self.output_norm:
            raise ValueError(
                "output_norm is for decoder-only and encoder blocks, not cross-attention"
            )
        if not self.attention_norm and not self.norm_first:
            raise ValueError("attention_norm=False is for pre-norm blocks: set norm_first")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"block dropout must be in [0, 1), got {self.dropout}")


Extra = TypeVar("Extra")  # what a sub-layer returns beside its output


class CrossInputs(NamedTuple):
    """What a decoder's cross-attention reads: the memory's projected keys and values
    (`MultiHeadAttention.project_key_value`; stacked on `layers` for a `LayerStack`) and the
    mask over them (the source's length)."""

    keys: Float[Array, "*layers src kv_heads head_dim"]
    values: Float[Array, "*layers src kv_heads head_dim"]
    mask: Mask | None = None


class BlockInputs(NamedTuple):
    """What one call of a block (or a stack of blocks) reads besides the hidden states.

    - `mask`: the self-attention's `zoo.nn.Mask` (causal order, padding, window, segments);
    - `positions`: absolute positions of the tokens, for rotary attention (default: the
      cache's index + 0, 1, ...); `rotary`: their cos/sin table, made once for every layer
      (`with_rotary`); the table wins where both are given;
    - `score_bias`: added to the self-attention scores (T5's relative positions);
    - `cross`: the encoder memory's keys, values and mask, for a decoder's cross-attention;
    - `cache`: keys and values of earlier positions; the new ones are written at its index
      and the queries attend to the whole cache, the mask's `offset` saying where they sit
      (a causal mask without an offset: the cache was empty, a prefill over the new keys).
    """

    mask: Mask | None = None
    positions: Int[Array, " seq"] | None = None
    rotary: RotaryTable | None = None
    score_bias: Float[Array, "heads seq kv_seq"] | None = None
    cross: CrossInputs | None = None
    cache: KVCache | None = None

    def with_rotary(self, attention: MultiHeadAttention, length: int) -> BlockInputs:
        """These inputs with the rotary table of the positions filled in (once, for every
        layer); unchanged when there is one or the attention has no rotary positions."""
        if self.rotary is not None or attention.rotary is None:
            return self
        offset = 0 if self.cache is None else self.cache.index
        table = attention.rotary_table(self.positions, length=length, offset=offset)
        return self._replace(rotary=table)


class BlockExtras(NamedTuple):
    """What a block returns besides its output: the updated cache and attention weights."""

    cache: KVCache | None
    self_weights: Float[Array, "heads seq kv_seq"] | None
    cross_weights: Float[Array, "heads seq src"] | None
    router: RouterStats | None = None  # a mixture-of-experts feed-forward's statistics


class TransformerBlock(eqx.Module):
    """A transformer layer for one sequence `[seq, d_model]`; batch with `jax.vmap`."""

    self_attention: MultiHeadAttention
    self_attention_norm: Norm | None  # None: the attention reads the input (ModernBERT)
    cross_attention: MultiHeadAttention | None
    cross_attention_norm: Norm | None
    feed_forward: FeedForward | MoEFeedForward
    feed_forward_norm: Norm
    self_attention_output_norm: Norm | None  # the sandwich's second norms (Gemma 2/3)
    feed_forward_output_norm: Norm | None
    dropout: Dropout
    norm_first: bool = eqx.field(static=True)
    output_norm: bool = eqx.field(static=True, default=False)

    def __init__(
        self,
        d_model: int,
        settings: BlockSettings,
        *,
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        s, init = settings, Init() if init is None else init
        self_key, cross_key, ff_key = jax.random.split(key, 3)

        def norm() -> Norm:
            return s.norm.make(d_model, init.dtype)

        self.self_attention = MultiHeadAttention(d_model, s.attention, init=init, key=self_key)
        self.self_attention_norm = norm() if s.attention_norm else None
        self.cross_attention, self.cross_attention_norm = None, None
        if s.cross_attention is not None:
            self.cross_attention = MultiHeadAttention(
                d_model, s.cross_attention, init=init, key=cross_key
            )
            self.cross_attention_norm = norm()
        if isinstance(s.feed_forward, MoESettings):
            self.feed_forward = MoEFeedForward(d_model, s.feed_forward, init=init, key=ff_key)
        else:
            self.feed_forward = FeedForward(d_model, s.feed_forward, init=init, key=ff_key)
        self.feed_forward_norm = norm()
        sandwich = s.output_norm and s.norm_first
        self.self_attention_output_norm = norm() if sandwich else None
        self.feed_forward_output_norm = norm() if sandwich else None
        self.dropout = Dropout(s.dropout)
        self.norm_first = s.norm_first
        self.output_norm = s.output_norm

    def with_call(self, *, window: int | None, rope: Rope | None) -> TransformerBlock:
        """The same weights with another self-attention window and rotary base (a layer of a
        `LayerStack` that shares its weights' shapes with layers called otherwise)."""
        attention = self.self_attention.with_call(window=window, rope=rope)
        if attention is self.self_attention:
            return self
        return with_fields(self, self_attention=attention)

    def _residual(
        self,
        x: Array,
        norm: Callable[[Array], Array],
        sublayer: Callable[[Array, PRNGKeyArray | None], tuple[Array, Extra]],
        key: PRNGKeyArray | None,
        output_norm: Norm | None = None,
    ) -> tuple[Array, Extra]:
        sublayer_key, dropout_key = split_optional(key, 2)
        if self.output_norm and not self.norm_first:  # OLMo 2: the one norm is on the output
            update, extra = sublayer(x, sublayer_key)
            return x + self.dropout(norm(update), key=dropout_key), extra
        if self.norm_first:
            update, extra = sublayer(norm(x), sublayer_key)
            if output_norm is not None:
                update = output_norm(update)
            return x + self.dropout(update, key=dropout_key), extra
        update, extra = sublayer(x, sublayer_key)
        return norm(x + self.dropout(update, key=dropout_key)), extra

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        inputs: BlockInputs | None = None,
        *,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], BlockExtras]:
        """Run the layer on `x` with what `inputs` carries (`BlockInputs`)."""
        inputs = BlockInputs() if inputs is None else inputs
        inputs = inputs.with_rotary(self.self_attention, x.shape[0])
        self_key, cross_key, ff_key = split_optional(key, 3)
        mask, cache = inputs.mask, inputs.cache
        prefill = mask is not None and mask.causal and mask.offset is None

        def self_attend(h, k):
            attention = self.self_attention
            keys, values = attention.project_key_value(h, inputs.rotary)
            new_cache = None
            if cache is not None:
                new_cache = cache.write(keys, values)
                if not prefill:
                    keys, values = new_cache.keys, new_cache.values
            query = attention.project_query(h, inputs.rotary)
            out, weights = attention.attend(
                query,
                keys,
                values,
                mask,
                score_bias=inputs.score_bias,
                key=k,
                return_weights=return_weights,
            )
            return out, (new_cache, weights)

        x, (new_cache, self_weights) = self._residual(
            x,
            self._attention_norm(),
            self_attend,
            self_key,
            self.self_attention_output_norm,
        )

        cross_weights = None
        if self.cross_attention is not None:
            cross, cross_inputs = self.cross_attention, inputs.cross
            if cross_inputs is None:
                raise ValueError("this block has cross-attention: pass the memory's cross inputs")
            assert self.cross_attention_norm is not None

            def cross_attend(h, k):
                query = cross.project_query(h)
                return cross.attend(
                    query,
                    cross_inputs.keys,
                    cross_inputs.values,
                    cross_inputs.mask,
                    key=k,
                    return_weights=return_weights,
                )

            x, cross_weights = self._residual(x, self.cross_attention_norm, cross_attend, cross_key)

        def feed_forward(h, k):
            if isinstance(self.feed_forward, MoEFeedForward):
                return self.feed_forward(h, valid=_real_tokens(mask, cache, h.shape[0]), key=k)
            return self.feed_forward(h, key=k), None

        x, router = self._residual(
            x, self.feed_forward_norm, feed_forward, ff_key, self.feed_forward_output_norm
        )
        return x, BlockExtras(new_cache, self_weights, cross_weights, router)

    def _attention_norm(self) -> Callable[[Array], Array]:
        """The norm before the self-attention; the identity for a block without one."""
        norm = self.self_attention_norm
        return (lambda h: h) if norm is None else norm


def _real_tokens(mask: Mask | None, cache: KVCache | None, length: int) -> Array | None:
    """Which positions count in the router statistics: the real tokens of a compacted pass
    (its mask's key length); every position otherwise (decoding keeps no statistics)."""
    if mask is None or mask.key_length is None or cache is not None:
        return None
    return jnp.arange(length) < mask.key_length
