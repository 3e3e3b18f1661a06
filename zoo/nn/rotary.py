"""Rotary position embedding (RoPE): positions as rotations of query and key pairs.

Each head vector is split into two halves `(x1, x2)` (the "rotate-half" layout of HuggingFace's
Llama, not interleaved pairs); pair `i` is rotated by the angle `position * inv_freq[i]` with
`inv_freq[i] = theta ** (-2i / head_dim)`. The score of a query at position p and a key at
position s then depends on p - s only. Positions are absolute token indices, so a KV cache keeps
the rotated keys and decoding continues with the next index.

The cos and sin of the angles are the same in every layer and every head: a model computes them
once per forward pass (`RotaryEmbedding.table`, `[seq, head_dim]`) and hands the `RotaryTable`
to each layer (HuggingFace's `position_embeddings`). Computed inside a scanned layer instead,
XLA evaluates them again in every layer, in the backward pass's recomputation, and once per head
where it fuses them into the rotation.

Scaling variants stretch the context a model was trained for:
- `linear`: every frequency divided by `factor` (position interpolation);
- `llama3`: long wavelengths divided by `factor`, short ones kept, a smooth blend between
  (Llama 3.1 / 3.2).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

ROPE_SCALINGS = (None, "linear", "llama3")


def rotary_inverse_frequencies(
    head_dim: int,
    theta: float = 10000.0,
    *,
    scaling: str | None = None,
    factor: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_positions: int = 8192,
) -> np.ndarray:
    """The `head_dim // 2` rotation frequencies (float32), after the chosen scaling."""
    if head_dim % 2 != 0:
        raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"unknown rope scaling {scaling!r}; choose one of {ROPE_SCALINGS}")
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / np.power(np.float32(theta), exponents)).astype(np.float32)
    if scaling == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32)
    if scaling == "llama3":
        low_wavelen = original_max_positions / low_freq_factor
        high_wavelen = original_max_positions / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original_max_positions / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled).astype(np.float32)
    return inv_freq


def rotate_half(x: Float[Array, "*lead dim"]) -> Float[Array, "*lead dim"]:
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RotaryTable(NamedTuple):
    """cos and sin of the rotation angles of `seq` positions, `[seq, head_dim]` float32 each.

    Made by `RotaryEmbedding.table`; the same for every layer and head, so computed once.
    """

    cos: Float[Array, "seq head_dim"]
    sin: Float[Array, "seq head_dim"]


def apply_rotary(
    x: Float[Array, "seq heads head_dim"], table: RotaryTable
) -> Float[Array, "seq heads head_dim"]:
    """Rotate every head of `x` by the table's angles, in float32, cast back to `x.dtype`."""
    expected = (x.shape[0], x.shape[-1])
    if table.cos.shape != expected or table.sin.shape != expected:
        raise ValueError(
            f"the rotary table is {table.cos.shape} but the [seq, heads, head_dim] input "
            f"{x.shape} needs {expected}: make it from these positions with "
            "RotaryEmbedding.table(positions)"
        )
    cos = table.cos.astype(jnp.float32)[:, None, :]
    sin = table.sin.astype(jnp.float32)[:, None, :]
    x32 = x.astype(jnp.float32)
    return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


class RotaryEmbedding(eqx.Module):
    """Rotates `[seq, heads, head_dim]` queries or keys by their absolute positions.

    Holds no arrays: the frequencies follow from the static settings. The rotation is computed
    in float32 and the result cast back to the input dtype. `table(positions)` gives the cos and
    sin once for many calls (every layer of a model).
    """

    head_dim: int = eqx.field(static=True)
    theta: float = eqx.field(static=True)
    scaling: str | None = eqx.field(static=True)
    factor: float = eqx.field(static=True)
    low_freq_factor: float = eqx.field(static=True)
    high_freq_factor: float = eqx.field(static=True)
    original_max_positions: int = eqx.field(static=True)

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        *,
        scaling: str | None = None,
        factor: float = 1.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_max_positions: int = 8192,
    ):
        self.head_dim = head_dim
        self.theta = float(theta)
        self.scaling = scaling
        self.factor = float(factor)
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.original_max_positions = int(original_max_positions)
        self.inverse_frequencies()  # validate now, not at the first call

    def inverse_frequencies(self) -> np.ndarray:
        return rotary_inverse_frequencies(
            self.head_dim,
            self.theta,
            scaling=self.scaling,
            factor=self.factor,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            original_max_positions=self.original_max_positions,
        )

    def angles(self, positions: Int[Array, " seq"]) -> Float[Array, "seq head_dim"]:
        """The rotation angle of every position and dimension (each pair's angle twice)."""
        inv_freq = jnp.asarray(self.inverse_frequencies())
        half = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
        return jnp.concatenate([half, half], axis=-1)

    def table(self, positions: Int[Array, " seq"]) -> RotaryTable:
        """cos and sin of `angles(positions)`, float32 `[seq, head_dim]`: compute once, pass on."""
        angles = self.angles(positions)
        return RotaryTable(jnp.cos(angles), jnp.sin(angles))

    def __call__(
        self,
        x: Float[Array, "seq heads head_dim"],
        positions: Int[Array, " seq"] | None = None,
        *,
        table: RotaryTable | None = None,
    ) -> Float[Array, "seq heads head_dim"]:
        """`x` rotated by `positions`, or by a `table` made once for them (which then wins)."""
        if table is None:
            if positions is None:
                raise ValueError("rotary needs the positions of the sequence or their table")
            table = self.table(positions)
        return apply_rotary(x, table)
