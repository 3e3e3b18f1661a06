"""Output heads on top of an encoder: the masked-LM head with its tied decoder."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.feedforward import ACTIVATIONS, check_activation
from zoo.nn.linear import Init, Linear
from zoo.nn.norm import LayerNorm


class MaskedLMHead(eqx.Module):
    """BERT's masked-LM head: `norm(act(transform(h))) @ token_weight^T + bias` at every position.

    The decoder is tied: its weight is the token embedding table, passed in by the model
    (`BertForMaskedLM`'s `cls.predictions`, RoBERTa's `lm_head`, DistilBERT's `vocab_*`).

    Args:
        d_model: the width of the hidden states (and of the token table).
        vocab_size: the vocabulary, the length of the output bias.
        activation: after the transform (a name of `zoo.nn.ACTIVATIONS`; BERT: "gelu").
        eps: the epsilon of the LayerNorm (the model's norms').
        init: how the transform's weight is drawn, and the dtype of every weight (a config's
            `init`); None: `Init()`.
        key: the transform's random key.
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
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        init = Init() if init is None else init
        check_activation(activation)
        self.transform = Linear(d_model, d_model, init=init, key=key)
        self.norm = LayerNorm(d_model, eps=eps, dtype=init.dtype)
        self.bias = jnp.zeros((vocab_size,), init.dtype)
        self.activation = activation

    def __call__(
        self,
        hidden: Float[Array, "seq d_model"],
        token_weight: Float[Array, "vocab d_model"],
    ) -> Float[Array, "seq vocab"]:
        x = self.norm(ACTIVATIONS[self.activation](self.transform(hidden)))
        return x @ token_weight.T + self.bias[None, :]
