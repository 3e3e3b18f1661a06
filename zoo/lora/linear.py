"""`LoRALinear`: a frozen `Linear` plus a trainable low-rank update `B A * alpha / rank`.

`A` is `[rank, in_features]` and `B` is `[out_features, rank]`, laid out as PEFT's `lora_A` and
`lora_B` weights. Inside a scanned layer stack both carry the stack's leading `layers` axis, like
every other array of the blocks.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.lora.quantized import QuantizedLinear, float_dtype
from zoo.nn.linear import Linear


class LoRALinear(eqx.Module):
    """`base(x) + (x A^T) B^T * alpha / rank` on the last axis of `x`.

    The base layer sits behind `jax.lax.stop_gradient`: its weights get a zero gradient (and the
    backward pass skips their weight-gradient products), so only `lora_a` and `lora_b` learn.
    """

    base: Linear | QuantizedLinear
    lora_a: Float[Array, "*layers rank in_features"]
    lora_b: Float[Array, "*layers out_features rank"]
    alpha: float = eqx.field(static=True)

    def __init__(
        self, base: Linear | QuantizedLinear, lora_a: Array, lora_b: Array, *, alpha: float | int
    ):
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.alpha = float(alpha)

    @staticmethod
    def wrap(
        base: Linear | QuantizedLinear, *, rank: int, alpha: float | int, key: PRNGKeyArray
    ) -> LoRALinear:
        """`base` with a fresh adapter: `A` uniform in `±1/sqrt(in_features)`, `B` zero.

        `B = 0` makes the wrapped layer compute exactly what `base` does. `A`'s range is PEFT's
        (`kaiming_uniform_(a=sqrt(5))`). Leading axes of `base.weight` (stacked layers) are kept.
        """
        lead = base.weight.shape[:-2]
        bound = 1.0 / math.sqrt(base.in_features)
        dtype = float_dtype(base)
        lora_a = jax.random.uniform(
            key, (*lead, rank, base.in_features), jnp.float32, -bound, bound
        ).astype(dtype)
        lora_b = jnp.zeros((*lead, base.out_features, rank), dtype)
        return LoRALinear(base, lora_a, lora_b, alpha=alpha)

    @property
    def rank(self) -> int:
        return self.lora_a.shape[-2]

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def scale(self) -> float:
        """`alpha / rank`: PEFT's `scaling` (without rsLoRA)."""
        return self.alpha / self.rank

    def delta(self) -> Float[Array, "*layers out_features in_features"]:
        """The update the adapter adds to the base weight: `scale * B @ A`, in float32."""
        product = jnp.einsum(
            "...or,...ri->...oi", self.lora_b.astype(jnp.float32), self.lora_a.astype(jnp.float32)
        )
        return product * self.scale

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = jax.lax.stop_gradient(self.base)(x)
        update = (x @ self.lora_a.T) @ self.lora_b.T
        return y + (update * self.scale).astype(y.dtype)
