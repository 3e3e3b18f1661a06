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

Scaling variants stretch the context a model was trained for (`Rope`, the settings of a
model's rotary positions, with their HuggingFace form beside the math):
- `linear`: every frequency divided by `factor` (position interpolation);
- `llama3`: long wavelengths divided by `factor`, short ones kept, a smooth blend between
  (Llama 3.1 / 3.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

ROPE_SCALINGS = (None, "linear", "llama3")
# HuggingFace's `rope_type` (or the older `type`) -> zoo's scaling
HF_ROPE_TYPES = {"default": None, "linear": "linear", "llama3": "llama3"}


@dataclass(frozen=True, kw_only=True)
class Rope:
    """The rotary settings of a model: base, and a scaling variant with its parameters.

    `scaling`: None (plain RoPE), "linear" (every frequency divided by `factor`) or "llama3"
    (Llama 3.1's blend: long wavelengths divided by `factor`, short ones kept, with
    `low_freq_factor`, `high_freq_factor` and `original_max_positions`). `from_hf` / `to_hf`
    read and write HuggingFace's `rope_theta` + `rope_scaling` (or `rope_parameters`).
    """

    theta: float = 10000.0  # base: pair i turns by position * theta^(-2i/head_dim)
    scaling: str | None = None  # None | linear | llama3
    factor: float = 1.0  # linear and llama3: how much longer the context is stretched
    low_freq_factor: float = 1.0  # llama3: wavelengths above original / low are scaled
    high_freq_factor: float = 4.0  # llama3: wavelengths below original / high are kept
    original_max_positions: int = 8192  # llama3: the context it was trained for

    def __post_init__(self) -> None:
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope scaling must be one of {ROPE_SCALINGS}, got {self.scaling!r}")
        if not self.theta > 0 or not self.factor > 0:
            raise ValueError(
                f"rope theta and factor must be positive, got {self.theta}, {self.factor}"
            )
        if self.scaling == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """The `head_dim // 2` rotation frequencies (float32), after the scaling."""
        if head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
        inv_freq = (1.0 / np.power(np.float32(self.theta), exponents)).astype(np.float32)
        if self.scaling == "linear":
            return (inv_freq / np.float32(self.factor)).astype(np.float32)
        if self.scaling == "llama3":
            return self._llama3(inv_freq)
        return inv_freq

    def _llama3(self, inv_freq: np.ndarray) -> np.ndarray:
        original = self.original_max_positions
        low_wavelen = original / self.low_freq_factor
        high_wavelen = original / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (original / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled).astype(np.float32)

    @staticmethod
    def from_hf(params: Mapping[str, Any]) -> Rope:
        """From HuggingFace's rope parameters: `rope_theta` with `rope_type` (or `type`),
        `factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`
        (transformers 5's `rope_parameters`, or `rope_scaling` plus `rope_theta`). Raises
        ValueError for a rope type zoo does not implement."""
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in HF_ROPE_TYPES:
            raise ValueError(
                f"rope type {kind!r} is not implemented; zoo implements {sorted(HF_ROPE_TYPES)}"
            )
        fields: dict[str, Any] = dict(theta=float(params.get("rope_theta", 10000.0)))
        fields["scaling"] = HF_ROPE_TYPES[kind]
        if kind in ("linear", "llama3"):
            fields["factor"] = float(params["factor"])
        if kind == "llama3":
            fields["low_freq_factor"] = float(params["low_freq_factor"])
            fields["high_freq_factor"] = float(params["high_freq_factor"])
            fields["original_max_positions"] = int(params["original_max_position_embeddings"])
        return Rope(**fields)

    def to_hf(self) -> tuple[float, dict[str, Any] | None]:
        """HuggingFace's `rope_theta` and `rope_scaling` (None without scaling)."""
        if self.scaling is None:
            return self.theta, None
        scaling: dict[str, Any] = dict(rope_type=self.scaling, factor=self.factor)
        if self.scaling == "llama3":
            scaling.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_positions,
            )
        return self.theta, scaling

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    Holds no arrays: the frequencies follow from `head_dim` and the `Rope` settings. The
    rotation is computed in float32 and the result cast back to the input dtype.
    `table(positions)` gives the cos and sin once for many calls (every layer of a model).
    """

    head_dim: int = eqx.field(static=True)
    rope: Rope = eqx.field(static=True)

    def __init__(self, head_dim: int, rope: Rope | None = None):
        self.head_dim = head_dim
        self.rope = Rope() if rope is None else rope
        self.inverse_frequencies()  # validate now, not at the first call

    def inverse_frequencies(self) -> np.ndarray:
        return self.rope.inverse_frequencies(self.head_dim)

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
        self, x: Float[Array, "seq heads head_dim"], table: RotaryTable
    ) -> Float[Array, "seq heads head_dim"]:
        """`x` rotated by the `table` of its positions (`table(positions)`)."""
        return apply_rotary(x, table)
