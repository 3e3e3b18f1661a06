"""Output heads on top of an encoder: the masked-LM head with its tied decoder."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.feedforward import ACTIVATIONS, check_activation
from zoo.nn.linear import Linear
from zoo.nn.norm import LayerNorm


class MaskedLMHead(eqx.Module):
    """BERT's masked-LM head: `norm(act(transform(h))) @ token_weight^T + bias` at every position.

    The decoder is tied: its weight is the token embedding table, passed in by the model
    (`BertForMaskedLM`'s `cls.predictions`, RoBERTa's `lm_head`, DistilBERT's `vocab_*`).
    """

    transform: Linear
    norm: LayerNorm
    bias: Float[Array, " vocab"]
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        *,
        activation: str = "gelu",
        eps: float = 1e-12,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        check_activation(activation)
        self.transform = Linear(d_model, d_model, init_std=init_std, dtype=dtype, key=key)
        self.norm = LayerNorm(d_model, eps=eps, dtype=dtype)
        self.bias = jnp.zeros((vocab_size,), dtype)
        self.activation = activation

    def __call__(
        self,
        hidden: Float[Array, "seq d_model"],
        token_weight: Float[Array, "vocab d_model"],
    ) -> Float[Array, "seq vocab"]:
        x = self.norm(ACTIVATIONS[self.activation](self.transform(hidden)))
        return x @ token_weight.T + self.bias[None, :]
