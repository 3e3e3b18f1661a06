"""The projection from the model width to the vocabulary, optionally padded for fast matmuls.

GPT-2's 50,257 tokens make a `[d_model, 50257]` matmul that no GPU tiles well: rounded up to a
multiple of 128 (50,304) the LM head's three matmuls run in a fraction of the time (on an H100,
zoo's GPT-2 train step went from 249k to 287k tokens/s with the padding alone). The padding
exists only inside a computation: the weights keep their real vocabulary (checkpoints, exports
and `model(tokens)` are unchanged), `VocabHead(hidden, multiple=128)` pads the table with zero
rows for one matmul, and the loss masks the extra columns (`zoo.tasks.vocab_loss`), so a padding
column never wins a softmax and gets no gradient.

`vocab_multiple(None)` is the default of the platform the program is traced for: 128 on a GPU,
1 (no padding) elsewhere, where the extra columns would only cost time.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from zoo.nn.kernel import current_platform
from zoo.nn.linear import Linear

GPU_VOCAB_MULTIPLE = 128


def vocab_multiple(multiple: int | None = None) -> int:
    """`multiple` itself, or by platform: 128 on a GPU, 1 elsewhere (the module docstring)."""
    if multiple is not None:
        if not isinstance(multiple, int) or multiple < 1:
            raise ValueError(
                f"the vocabulary multiple must be a positive integer, got {multiple!r}"
            )
        return multiple
    return GPU_VOCAB_MULTIPLE if current_platform() == "gpu" else 1


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value`."""
    return -(-value // multiple) * multiple


class VocabHead(eqx.Module):
    """`hidden -> logits` over the vocabulary: `[..., d_model] -> [..., width]`.

    A model's output layer as one value: a table (`weight`, tied embeddings or a plain
    `Linear` head) with an optional `bias` (MarianMT's final logits bias), or any other layer
    (`projection`: a LoRA or int8 head) called as it is. `scale` multiplies the hidden states
    first (T5 v1.0's `d_model**-0.5`); `softcap` squashes the logits into `(-softcap, softcap)`
    by `softcap * tanh(logits / softcap)` (Gemma 2's final logit soft-capping). Only a table can be padded: `width(multiple)` says how
    many columns a call returns; columns at `vocab_size` and beyond are padding.
    """

    weight: Float[Array, "vocab d_model"] | None
    bias: Float[Array, " vocab"] | None
    projection: eqx.Module | None
    vocab_size: int = eqx.field(static=True)
    scale: float | None = eqx.field(static=True)
    softcap: float | None = eqx.field(static=True, default=None)

    def __init__(
        self,
        layer: Float[Array, "vocab d_model"] | eqx.Module,
        *,
        bias: Float[Array, " vocab"] | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        """`layer` is the table itself, a `zoo.nn.Linear` (its weight and bias are used) or any
        layer mapping `[seq, d_model]` to `[seq, vocab]`."""
        self.projection = None
        if isinstance(layer, Linear):
            bias = layer.bias if bias is None else bias
            layer = layer.weight
        if isinstance(layer, eqx.Module):
            self.weight, self.projection = None, layer
            self.vocab_size = int(layer.out_features)  # type: ignore[attr-defined]
        else:
            self.weight = layer
            self.vocab_size = int(layer.shape[0])
        self.bias = bias
        self.scale = scale
        self.softcap = softcap

    def width(self, multiple: int = 1) -> int:
        """Columns of the logits a call with `multiple` returns."""
        if self.weight is None:
            return self.vocab_size
        return round_up(self.vocab_size, multiple)

    def __call__(
        self, hidden: Float[Array, "*positions d_model"], *, multiple: int = 1
    ) -> Float[Array, "*positions width"]:
        """Logits of every position (any leading axes: one sequence or a batch); with
        `multiple` > 1 (a table only) the vocabulary is padded with zero columns up to
        `width(multiple)`."""
        if self.scale is not None:
            hidden = hidden * self.scale
        if self.projection is not None:
            logits = self.projection(hidden)  # type: ignore[operator]
        else:
            assert self.weight is not None
            extra = self.width(multiple) - self.vocab_size
            weight = jnp.pad(self.weight, ((0, extra), (0, 0))) if extra else self.weight
            logits = hidden @ weight.T
        if self.bias is not None:
            extra = logits.shape[-1] - self.vocab_size
            bias = jnp.pad(self.bias, (0, extra)) if extra else self.bias
            bias = bias.astype(logits.dtype).reshape((1,) * (logits.ndim - 1) + (-1,))
            logits = logits + bias
        if self.softcap is not None:
            cap = jnp.asarray(self.softcap, logits.dtype)
            logits = jnp.tanh(logits / cap) * cap
        return logits
