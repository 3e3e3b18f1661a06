"""One transformer layer: self-attention, optional cross-attention, feed-forward.

An encoder block is a `TransformerBlock` without cross-attention run with a padding mask; a
decoder block runs with a causal mask and, in a translator, cross-attends to the encoder memory.
The norm (LayerNorm or RMSNorm) sits before each sub-layer (`norm_first=True`, GPT-2, Llama)
or after the residual sum (`norm_first=False`, the original Transformer and BERT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.attention import KVCache, MultiHeadAttention
from zoo.nn.dropout import Dropout, split_optional
from zoo.nn.feedforward import FeedForward
from zoo.nn.mask import Mask
from zoo.nn.norm import Norm, make_norm
from zoo.nn.rotary import RotaryEmbedding, RotaryTable


class BlockExtras(NamedTuple):
    """What a block returns besides its output: the updated cache and attention weights."""

    cache: KVCache | None
    self_weights: Float[Array, "heads seq kv_seq"] | None
    cross_weights: Float[Array, "heads seq src"] | None


class TransformerBlock(eqx.Module):
    """A transformer layer for one sequence `[seq, d_model]`; batch with `jax.vmap`."""

    self_attention: MultiHeadAttention
    self_attention_norm: Norm
    cross_attention: MultiHeadAttention | None
    cross_attention_norm: Norm | None
    feed_forward: FeedForward
    feed_forward_norm: Norm
    dropout: Dropout
    norm_first: bool = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        cross_attention: bool = False,
        activation: str = "gelu",
        gated: bool = False,
        norm: str = "layernorm",
        norm_first: bool = True,
        layer_norm_eps: float = 1e-5,
        use_bias: bool = True,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        attention_output_bias: bool | None = None,
        feed_forward_bias: bool | None = None,
        qk_norm: bool = False,
        rotary: RotaryEmbedding | None = None,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation_dropout: float | None = None,
        attention_implementation: str | None = None,
        scale_scores: bool = True,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        self_key, cross_key, ff_key = jax.random.split(key, 3)
        attention_kwargs = dict(
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            use_bias=use_bias,
            qkv_bias=qkv_bias,
            output_bias=attention_output_bias,
            qk_norm=qk_norm,
            norm_eps=layer_norm_eps,
            dropout_rate=attention_dropout,
            implementation=attention_implementation,
            scale_scores=scale_scores,
            init_std=init_std,
            dtype=dtype,
        )
        self.self_attention = MultiHeadAttention(
            d_model, num_heads, rotary=rotary, key=self_key, **attention_kwargs
        )
        self.self_attention_norm = make_norm(norm, d_model, eps=layer_norm_eps, dtype=dtype)
        if cross_attention:
            # positions enter through the self-attention: cross-attention keys are not rotated
            self.cross_attention = MultiHeadAttention(
                d_model, num_heads, key=cross_key, **attention_kwargs
            )
            self.cross_attention_norm = make_norm(norm, d_model, eps=layer_norm_eps, dtype=dtype)
        else:
            self.cross_attention = None
            self.cross_attention_norm = None
        self.feed_forward = FeedForward(
            d_model,
            d_ff,
            activation=activation,
            gated=gated,
            use_bias=use_bias if feed_forward_bias is None else feed_forward_bias,
            dropout_rate=dropout if activation_dropout is None else activation_dropout,
            init_std=init_std,
            dtype=dtype,
            key=ff_key,
        )
        self.feed_forward_norm = make_norm(norm, d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def _residual(
        self,
        x: Array,
        norm: Norm,
        sublayer: Callable[[Array, PRNGKeyArray | None], tuple[Array, Any]],
        key: PRNGKeyArray | None,
    ) -> tuple[Array, Any]:
        sublayer_key, dropout_key = split_optional(key, 2)
        if self.norm_first:
            update, extra = sublayer(norm(x), sublayer_key)
            return x + self.dropout(update, key=dropout_key), extra
        update, extra = sublayer(x, sublayer_key)
        return norm(x + self.dropout(update, key=dropout_key)), extra

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        *,
        mask: Mask | None = None,
        positions: Int[Array, " seq"] | None = None,
        rotary_table: RotaryTable | None = None,
        cross_kv: tuple[Array, Array] | None = None,
        cross_mask: Mask | None = None,
        cache: KVCache | None = None,
        cache_index: Int[Array, ""] | int = 0,
        score_bias: Float[Array, "heads seq kv_seq"] | None = None,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], BlockExtras]:
        """Run the layer.

        `mask` is the self-attention's `zoo.nn.Mask` (causal order, padding, window);
        `cross_mask` the cross-attention's (the source's length).
        `positions` are the absolute positions of the `seq` tokens for rotary attention
        (default: `cache_index + 0, 1, ...`); `rotary_table` is their cos/sin table made once
        for every layer (`MultiHeadAttention.rotary_table`), else the block makes it from
        `positions`.
        With `cache`, the new keys and values are written at `cache_index` and the queries attend
        to the whole cache, the mask's `offset` saying where they sit; a causal mask without an
        offset says the cache was empty (a prefill), and the queries attend to the new keys
        alone. `cross_kv` are the encoder memory's projected keys and values for this layer's
        cross-attention (see `MultiHeadAttention.project_key_value`). `score_bias` is added to
        the self-attention scores (relative positions; `[heads, seq, kv_seq]` for the keys
        attended to).
        """
        self_key, cross_key, ff_key = split_optional(key, 3)
        prefill = mask is not None and mask.causal and mask.offset is None
        if rotary_table is None:
            rotary_table = self.self_attention.rotary_table(
                positions, length=x.shape[0], offset=cache_index
            )

        def self_attend(h, k):
            attention = self.self_attention
            keys, values = attention.project_key_value(h, rotary_table=rotary_table)
            new_cache = None
            if cache is not None:
                new_cache = cache.write(keys, values, cache_index)
                if not prefill:
                    keys, values = new_cache.keys, new_cache.values
            query = attention.project_query(h, rotary_table=rotary_table)
            out, weights = attention.attend(
                query,
                keys,
                values,
                mask,
                score_bias=score_bias,
                key=k,
                return_weights=return_weights,
            )
            return out, (new_cache, weights)

        x, (new_cache, self_weights) = self._residual(
            x, self.self_attention_norm, self_attend, self_key
        )

        cross_weights = None
        if self.cross_attention is not None:
            if cross_kv is None:
                raise ValueError("this block has cross-attention: pass the memory's cross_kv")
            cross = self.cross_attention
            assert self.cross_attention_norm is not None

            def cross_attend(h, k):
                return cross.attend(
                    cross.project_query(h),
                    *cross_kv,
                    cross_mask,
                    key=k,
                    return_weights=return_weights,
                )

            x, cross_weights = self._residual(x, self.cross_attention_norm, cross_attend, cross_key)

        def feed_forward(h, k):
            return self.feed_forward(h, key=k), None

        x, _ = self._residual(x, self.feed_forward_norm, feed_forward, ff_key)
        return x, BlockExtras(new_cache, self_weights, cross_weights)
