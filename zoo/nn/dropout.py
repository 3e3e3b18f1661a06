"""Dropout that is a no-op without a key, so a model called without a key is deterministic."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray


class Dropout(eqx.Module):
    """Inverted dropout.

    Active only when a `key` is passed and the module is not in inference mode
    (`eqx.nn.inference_mode(model)` sets `inference=True` on every `Dropout`).
    """

    rate: float = eqx.field(static=True)
    inference: bool = False

    def __init__(self, rate: float = 0.0, *, inference: bool = False):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.inference = inference

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        if key is None or self.inference or self.rate == 0.0:
            return x
        keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x))


def split_optional(key: PRNGKeyArray | None, num: int) -> list[PRNGKeyArray | None]:
    """Split `key` into `num` keys, or return `num` Nones when there is no key."""
    if key is None:
        return [None] * num
    return list(jax.random.split(key, num))
