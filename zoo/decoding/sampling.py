"""Choosing the next token from one position's logits: greedy, temperature, top-k, top-p.

Everything here works on one distribution (`Float[Array, "vocab"]`); batch with `jax.vmap`.
The filter numbers travel as arrays, so changing `temperature`, `top_k` or `top_p` does not recompile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Scalar


@dataclass(frozen=True)
class SamplingSettings:
    """How to pick each token; `temperature=0` is greedy (argmax, no key needed), where `top_k`
    and `top_p` are refused: they act only on a draw."""

    temperature: float = 0.0  # divides the logits; 0 means greedy
    top_k: int | None = None  # keep only the k most likely tokens
    top_p: float | None = None  # keep the smallest set of tokens whose probability reaches p

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature}"
            )
        if self.top_k is not None and (not isinstance(self.top_k, Integral) or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.greedy:  # argmax ignores the filters: refuse rather than drop them silently
            for name in ("top_k", "top_p"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)} only acts when sampling: pass a "
                        f"temperature above 0 (temperature=0 is greedy), or drop {name}"
                    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def values(self) -> dict[str, Array] | None:
        """The numbers `choose_token` needs, as arrays; None when greedy."""
        if self.greedy:
            return None
        values = {"temperature": jnp.asarray(self.temperature, jnp.float32)}
        if self.top_k is not None:
            values["top_k"] = jnp.asarray(int(self.top_k), jnp.int32)
        if self.top_p is not None:
            values["top_p"] = jnp.asarray(self.top_p, jnp.float32)
        return values

    def check_key(self, key: PRNGKeyArray | None) -> None:
        if not self.greedy and key is None:
            raise ValueError(
                f"sampling with temperature={self.temperature} needs a random key: pass "
                "key=jax.random.key(seed), or temperature=0 for greedy decoding"
            )


def sampling_or_greedy(sampling: object) -> SamplingSettings:
    """`sampling`, or greedy settings when it is None; anything else is refused."""
    if sampling is None:
        return SamplingSettings()
    if not isinstance(sampling, SamplingSettings):
        raise TypeError(
            f"sampling must be a zoo.decoding.SamplingSettings (e.g. "
            f"SamplingSettings(temperature=0.8, top_k=50)), got {type(sampling).__name__}"
        )
    return sampling


def top_k_filter(
    logits: Float[Array, " vocab"], top_k: Int[Array, ""] | int
) -> Float[Array, " vocab"]:
    """Set every logit below the k-th largest to -inf (ties with the k-th are all kept)."""
    k = jnp.clip(jnp.asarray(top_k), 1, logits.shape[0])
    descending = jnp.sort(logits)[::-1]
    threshold = descending[k - 1]
    return jnp.where(logits < threshold, -jnp.inf, logits)


def top_p_filter(
    logits: Float[Array, " vocab"], top_p: Float[Array, ""] | float
) -> Float[Array, " vocab"]:
    """Nucleus filter: keep the most likely tokens until their probability reaches `top_p`.

    A token is kept when the probability of the tokens more likely than it is still below
    `top_p`, so the most likely token always survives. Other logits become -inf.
    """
    order = jnp.argsort(logits)[::-1]
    sorted_logits = logits[order]
    sorted_probs = jax.nn.softmax(sorted_logits)
    mass_before = jnp.cumsum(sorted_probs) - sorted_probs
    num_kept = jnp.sum(mass_before < top_p)
    threshold = sorted_logits[jnp.maximum(num_kept, 1) - 1]
    return jnp.where(logits < threshold, -jnp.inf, logits)


def filter_logits(
    logits: Float[Array, " vocab"],
    *,
    temperature: Float[Array, ""] | float = 1.0,
    top_k: Int[Array, ""] | int | None = None,
    top_p: Float[Array, ""] | float | None = None,
) -> Float[Array, " vocab"]:
    """Logits to sample from: divided by `temperature`, then top-k, then top-p filtered."""
    logits = logits.astype(jnp.float32) / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def choose_token(
    logits: Float[Array, " vocab"],
    key: PRNGKeyArray | None,
    values: dict[str, Scalar] | None,
) -> Int[Array, ""]:
    """The next token: argmax when `values` is None (greedy), else a draw from the filtered
    distribution. `values` comes from `SamplingSettings.values()`: which filters it holds is
    static, their numbers are traced.
    """
    if values is None:
        return jnp.argmax(logits).astype(jnp.int32)
    if key is None:
        raise ValueError("sampling needs a random key")
    filtered = filter_logits(
        logits,
        temperature=values["temperature"],
        top_k=values.get("top_k"),
        top_p=values.get("top_p"),
    )
    return jax.random.categorical(key, filtered).astype(jnp.int32)
