"""Position-wise feed-forward network, dense or gated.

Dense (GPT-2, BERT, the paper): `output(act(hidden(x)))`. Gated (Llama's SwiGLU with `silu`,
GeGLU with `gelu`/`gelu_tanh`): `output(act(gate(x)) * hidden(x))`, where `gate` and `hidden` are
HuggingFace's `gate_proj` and `up_proj`, and `output` its `down_proj`.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Linear

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    # exact erf GELU: BERT's "gelu"
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    # tanh approximation: GPT-2's "gelu_new"
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    # x * sigmoid(x): MarianMT's "swish"
    "silu": jax.nn.silu,
}


FEED_FORWARD_KINDS = ("dense", "gated")


def check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")


class FeedForward(eqx.Module):
    """`W2 · act(W1 · x + b1) + b2` (or gated: `W2 · (act(Wg · x) * (W1 · x))`) at every position."""

    gate: Linear | None
    hidden: Linear
    output: Linear
    dropout: Dropout
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "gelu",
        gated: bool = False,
        use_bias: bool = True,
        dropout_rate: float = 0.0,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        check_activation(activation)
        hidden_key, output_key = jax.random.split(key)
        gate_key = jax.random.fold_in(key, 1)  # dense layers keep their initialisation
        common = dict(use_bias=use_bias, init_std=init_std, dtype=dtype)
        self.gate = Linear(d_model, d_ff, key=gate_key, **common) if gated else None
        self.hidden = Linear(d_model, d_ff, key=hidden_key, **common)
        self.output = Linear(d_ff, d_model, key=output_key, **common)
        self.dropout = Dropout(dropout_rate)
        self.activation = activation

    def __call__(
        self, x: Float[Array, "seq d_model"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "seq d_model"]:
        act = ACTIVATIONS[self.activation]
        up = self.hidden(x)
        hidden = act(up) if self.gate is None else act(self.gate(x)) * up
        return self.output(self.dropout(hidden, key=key))
