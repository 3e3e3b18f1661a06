"""Position-wise feed-forward network, dense or gated.

Dense (GPT-2, BERT, the paper): `output(act(hidden(x)))`. Gated (Llama's SwiGLU with `silu`,
GeGLU with `gelu`/`gelu_tanh`): `output(act(gate(x)) * hidden(x))`, where `gate` and `hidden` are
HuggingFace's `gate_proj` and `up_proj`, and `output` its `down_proj`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Init, Linear

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


@dataclass(frozen=True, kw_only=True)
class FeedForwardSettings:
    """What a `FeedForward` is, besides its input width and initialisation."""

    d_ff: int = 2048  # hidden width
    activation: str = "gelu"  # relu | gelu (erf) | gelu_tanh | silu
    kind: str = "dense"  # dense: act(up(x)); gated: act(gate(x)) * up(x) (SwiGLU, GeGLU)
    bias: bool = True  # biases of the projections
    dropout: float = 0.0  # dropout on the hidden activations

    def __post_init__(self) -> None:
        if not isinstance(self.d_ff, int) or self.d_ff < 1:
            raise ValueError(f"d_ff must be a positive integer, got {self.d_ff!r}")
        check_activation(self.activation)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"feed-forward dropout must be in [0, 1), got {self.dropout}")
        if self.kind not in FEED_FORWARD_KINDS:
            raise ValueError(
                f"feed_forward kind must be one of {FEED_FORWARD_KINDS}, got {self.kind!r}"
            )


class FeedForward(eqx.Module):
    """`W2 · act(W1 · x + b1) + b2` (or gated: `W2 · (act(Wg · x) * (W1 · x))`) at every position."""

    gate: Linear | None
    hidden: Linear
    output: Linear
    dropout: Dropout
    activation: str = eqx.field(static=True)
    d_ff: int = eqx.field(static=True, default=0)  # the hidden width

    def __init__(
        self,
        d_model: int,
        settings: FeedForwardSettings,
        *,
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        s, init = settings, Init() if init is None else init
        hidden_key, output_key = jax.random.split(key)
        gate_key = jax.random.fold_in(key, 1)  # dense layers keep their initialisation
        bias = s.bias
        gated = s.kind == "gated"
        self.gate = init.linear(d_model, s.d_ff, bias, key=gate_key) if gated else None
        self.hidden = init.linear(d_model, s.d_ff, bias, key=hidden_key)
        self.output = init.linear(s.d_ff, d_model, bias, key=output_key)
        self.dropout = Dropout(s.dropout)
        self.activation = s.activation
        self.d_ff = s.d_ff

    def __call__(
        self, x: Float[Array, "seq d_model"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "seq d_model"]:
        act = ACTIVATIONS[self.activation]
        up = self.hidden(x)
        hidden = act(up) if self.gate is None else act(self.gate(x)) * up
        return self.output(self.dropout(hidden, key=key))
