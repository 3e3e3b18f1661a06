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
  (Llama 3.1 / 3.2);
- `longrope`: each frequency divided by its own factor, from `short_factor` while a call's
  positions stay within `original_max_positions` and from `long_factor` once they pass it,
  with cos and sin multiplied by an attention factor (Phi-3.5, Phi-4-mini). The switch is made
  per call from the call's largest position (transformers makes it from the batch's);
- `yarn`: frequencies whose wavelength fits many times in `original_max_positions` kept, long
  ones divided by `factor`, a linear ramp between (set by `beta_fast` and `beta_slow`), with
  cos and sin multiplied by an attention factor (OLMo 3's full layers).

`partial_rotary_factor` < 1 rotates only the first `int(head_dim * factor)` dimensions of each
head and passes the rest through (Phi-4-mini: 0.75).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

ROPE_SCALINGS = (None, "linear", "llama3", "longrope", "yarn")
# HuggingFace's `rope_type` (or the older `type`) -> zoo's scaling ("su": Phi-3's older name)
HF_ROPE_TYPES = {
    "default": None,
    "linear": "linear",
    "llama3": "llama3",
    "longrope": "longrope",
    "su": "longrope",
    "yarn": "yarn",
}


@dataclass(frozen=True, kw_only=True)
class Rope:
    """The rotary settings of a model: base, and a scaling variant with its parameters.

    `scaling`: None (plain RoPE), "linear" (every frequency divided by `factor`) or "llama3"
    (Llama 3.1's blend: long wavelengths divided by `factor`, short ones kept, with
    `low_freq_factor`, `high_freq_factor` and `original_max_positions`), "longrope" or "yarn"
    (see the module's docstring). `from_hf` / `to_hf`
    read and write HuggingFace's `rope_theta` + `rope_scaling` (or `rope_parameters`).
    """

    theta: float = 10000.0  # base: pair i turns by position * theta^(-2i/head_dim)
    scaling: str | None = None  # None | linear | llama3 | longrope | yarn
    factor: float = 1.0  # how much longer the context is stretched
    low_freq_factor: float = 1.0  # llama3: wavelengths above original / low are scaled
    high_freq_factor: float = 4.0  # llama3: wavelengths below original / high are kept
    original_max_positions: int = 8192  # llama3, longrope, yarn: the context it was trained for
    short_factor: Sequence[float] = ()  # longrope: per-frequency divisors (kept as a tuple)
    long_factor: Sequence[float] = ()  # longrope: per-frequency divisors beyond the original
    attention_factor: float | None = None  # longrope, yarn: cos/sin scale; None: from factor
    beta_fast: float = 32.0  # yarn: pairs turning more often than this over the original are kept
    beta_slow: float = 1.0  # yarn: pairs turning less often than this are divided by factor
    truncate: bool = True  # yarn: round the ramp's ends outwards to whole pairs
    partial_rotary_factor: float = 1.0  # the fraction of each head that rotates (Phi-4-mini)

    def __post_init__(self) -> None:
        for name in ("short_factor", "long_factor"):  # JSON lists: keep the record hashable
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
            )
        if self.scaling == "longrope" and len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                "longrope needs short_factor and long_factor of one length (rotary dims / 2), "
                f"got {len(self.short_factor)} and {len(self.long_factor)}"
            )
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

    def rotary_dim(self, head_dim: int) -> int:
        """How many dimensions of a `head_dim` head rotate (all, unless partial)."""
        dim = int(head_dim * self.partial_rotary_factor)
        if dim % 2 != 0 or dim == 0:
            raise ValueError(
                f"rotary positions need an even number of rotating dimensions, got {dim} "
                f"(head_dim={head_dim} x partial_rotary_factor={self.partial_rotary_factor})"
            )
        return dim

    @property
    def table_scale(self) -> float:
        """What cos and sin are multiplied by: longrope's and yarn's attention factor, else 1."""
        if self.scaling not in ("longrope", "yarn"):
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1.0:
            return 1.0
        if self.scaling == "yarn":
            return 0.1 * math.log(self.factor) + 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))

    def _longrope(self, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """The (short, long) frequencies of longrope."""
        dim = self.rotary_dim(head_dim)
        if len(self.short_factor) != dim // 2:
            raise ValueError(
                f"longrope factors have {len(self.short_factor)} values, but {dim} rotating "
                f"dimensions need {dim // 2}"
            )
        base = np.power(
            np.float32(self.theta), np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        )
        short = 1.0 / (np.asarray(self.short_factor, np.float32) * base)
        long = 1.0 / (np.asarray(self.long_factor, np.float32) * base)
        return short.astype(np.float32), long.astype(np.float32)

    def frequencies_at(self, head_dim: int, positions: Int[Array, " seq"]) -> Array:
        """The frequencies a call at `positions` rotates by: longrope picks its long factors
        once the largest position passes `original_max_positions`; others are fixed."""
        if self.scaling != "longrope":
            return jnp.asarray(self.inverse_frequencies(head_dim))
        short, long = self._longrope(head_dim)
        beyond = jnp.max(positions) + 1 > self.original_max_positions
        return jnp.where(beyond, jnp.asarray(long), jnp.asarray(short))

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """The `rotary_dim // 2` rotation frequencies (float32), after the scaling (longrope:
        the short ones)."""
        if head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        if self.scaling == "longrope":
            return self._longrope(head_dim)[0]
        dim = self.rotary_dim(head_dim)
        exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        inv_freq = (1.0 / np.power(np.float32(self.theta), exponents)).astype(np.float32)
        if self.scaling == "linear":
            return (inv_freq / np.float32(self.factor)).astype(np.float32)
        if self.scaling == "llama3":
            return self._llama3(inv_freq)
        if self.scaling == "yarn":
            return self._yarn(inv_freq, dim)
        return inv_freq

    def _yarn(self, inv_freq: np.ndarray, dim: int) -> np.ndarray:
        """YaRN's blend: pairs below the ramp keep their frequency, pairs above it are divided
        by `factor`; the ramp runs between the pairs that turn `beta_fast` and `beta_slow`
        times over the original context."""

        def pair_turning(turns: float) -> float:
            wavelength = self.original_max_positions / (turns * 2 * math.pi)
            return dim * math.log(wavelength) / (2 * math.log(self.theta))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a step, not a division by zero
        pairs = np.arange(dim // 2, dtype=np.float32)
        ramp = np.clip((pairs - np.float32(low)) / np.float32(high - low), 0, 1)
        kept = 1 - ramp.astype(np.float32)
        divided = inv_freq / np.float32(self.factor)
        return (divided * (1 - kept) + inv_freq * kept).astype(np.float32)

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
    def from_hf(params: Mapping[str, object]) -> Rope:
        """From HuggingFace's rope parameters: `rope_theta` with `rope_type` (or `type`),
        `factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`
        (transformers 5's `rope_parameters`, or `rope_scaling` plus `rope_theta`). Raises
        ValueError for a rope type zoo does not implement, or a parameter that is not a
        number."""
        kind = params.get("rope_type", params.get("type", "default"))
        if not isinstance(kind, str) or kind not in HF_ROPE_TYPES:
            raise ValueError(
                f"rope type {kind!r} is not implemented; zoo implements {sorted(HF_ROPE_TYPES)}"
            )
        rope = Rope(
            theta=_number(params, "rope_theta", 10000.0),
            scaling=HF_ROPE_TYPES[kind],
            partial_rotary_factor=_number(params, "partial_rotary_factor", 1.0, none_is=1.0),
        )
        if kind in ("linear", "llama3"):
            rope = replace(rope, factor=_number(params, "factor"))
        if kind == "llama3":
            rope = replace(
                rope,
                low_freq_factor=_number(params, "low_freq_factor"),
                high_freq_factor=_number(params, "high_freq_factor"),
                original_max_positions=int(_number(params, "original_max_position_embeddings")),
            )
        if rope.scaling == "yarn":
            rope = _yarn_from_hf(rope, params)
        if rope.scaling == "longrope":
            original = int(_number(params, "original_max_position_embeddings"))
            # transformers: the factor defaults to max_position_embeddings / original
            given, longest = params.get("factor"), params.get("max_position_embeddings")
            if given:
                factor = _number(params, "factor")
            elif longest is not None:
                factor = _number(params, "max_position_embeddings") / original
            else:
                raise ValueError("longrope needs its factor or the model's max_position_embeddings")
            attention = params.get("attention_factor")
            rope = replace(
                rope,
                short_factor=_numbers(params, "short_factor"),
                long_factor=_numbers(params, "long_factor"),
                original_max_positions=original,
                factor=factor,
                attention_factor=None if attention is None else _number(params, "attention_factor"),
            )
        return rope

    def to_hf(self) -> tuple[float, dict[str, object] | None]:
        """HuggingFace's `rope_theta` and `rope_scaling` (None without scaling)."""
        if self.scaling is None:
            return self.theta, None
        scaling: dict[str, object] = dict(rope_type=self.scaling, factor=self.factor)
        if self.scaling == "llama3":
            scaling.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_positions,
            )
        if self.scaling == "longrope":
            scaling = dict(
                rope_type="longrope",
                short_factor=list(self.short_factor),
                long_factor=list(self.long_factor),
                original_max_position_embeddings=self.original_max_positions,
                factor=self.factor,
            )
            if self.attention_factor is not None:
                scaling["attention_factor"] = self.attention_factor
        if self.scaling == "yarn":
            scaling.update(
                original_max_position_embeddings=self.original_max_positions,
                beta_fast=self.beta_fast,
                beta_slow=self.beta_slow,
            )
            if self.attention_factor is not None:
                scaling["attention_factor"] = self.attention_factor
            if not self.truncate:
                scaling["truncate"] = False
        return self.theta, scaling

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _yarn_from_hf(rope: Rope, params: Mapping[str, object]) -> Rope:
    """`rope` with YaRN's parameters from HuggingFace's, defaulted as transformers does: the
    factor from the model's length over the original, the attention factor from `mscale` and
    `mscale_all_dim` where both are given, else from the factor (`table_scale`)."""
    original = int(_number(params, "original_max_position_embeddings"))
    if params.get("factor") is not None:
        factor = _number(params, "factor")
    elif params.get("max_position_embeddings") is not None:
        factor = _number(params, "max_position_embeddings") / original
    else:
        raise ValueError("yarn needs its factor or the model's max_position_embeddings")
    attention = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention is None and mscale and mscale_all_dim:
        attention = _yarn_mscale(factor, _number(params, "mscale")) / _yarn_mscale(
            factor, _number(params, "mscale_all_dim")
        )
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"rope parameter truncate must be true or false, got {truncate!r}")
    return replace(
        rope,
        factor=factor,
        original_max_positions=original,
        attention_factor=None if attention is None else _number({"a": attention}, "a"),
        beta_fast=_number(params, "beta_fast", 32.0, none_is=32.0) or 32.0,
        beta_slow=_number(params, "beta_slow", 1.0, none_is=1.0) or 1.0,
        truncate=truncate,
    )


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _number(
    params: Mapping[str, object], name: str, default: float | None = None, *, none_is=None
) -> float:
    """The rope parameter `name` as a float (`default` when absent, `none_is` when null)."""
    value = params.get(name, default)
    if value is None and none_is is not None:
        value = none_is
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"rope parameter {name} must be a number, got {value!r}")
    return float(value)


def _numbers(params: Mapping[str, object], name: str) -> tuple[float, ...]:
    """The rope parameter `name`, a list of numbers (longrope's factors), as floats."""
    values = params.get(name)
    if not isinstance(values, list | tuple):
        raise ValueError(f"rope parameter {name} must be a list of numbers, got {values!r}")
    return tuple(_number({name: value}, name) for value in values)


def rotate_half(x: Float[Array, "*lead dim"]) -> Float[Array, "*lead dim"]:
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RotaryTable(NamedTuple):
    """cos and sin of the rotation angles of `seq` positions, `[seq, rotary_dim]` float32 each
    (`rotary_dim` is head_dim unless the rotary is partial).

    Made by `RotaryEmbedding.table`; the same for every layer and head, so computed once.
    """

    cos: Float[Array, "seq rotary_dim"]
    sin: Float[Array, "seq rotary_dim"]


def apply_rotary(
    x: Float[Array, "seq heads head_dim"], table: RotaryTable
) -> Float[Array, "seq heads head_dim"]:
    """Rotate every head of `x` by the table's angles, in float32, cast back to `x.dtype`.

    A table narrower than the heads (partial rotary) rotates their first dimensions only."""
    rotating = table.cos.shape[-1]
    if (
        table.cos.shape[0] != x.shape[0]
        or table.sin.shape != table.cos.shape
        or rotating > x.shape[-1]
    ):
        raise ValueError(
            f"the rotary table is {table.cos.shape} but the [seq, heads, head_dim] input "
            f"{x.shape} needs ({x.shape[0]}, {x.shape[-1]}) (fewer columns: a partial rotary): "
            "make it from these positions with RotaryEmbedding.table(positions)"
        )
    cos = table.cos.astype(jnp.float32)[:, None, :]
    sin = table.sin.astype(jnp.float32)[:, None, :]
    x32 = x.astype(jnp.float32)
    rotated = x32[..., :rotating]
    rotated = rotated * cos + rotate_half(rotated) * sin
    if rotating < x.shape[-1]:
        rotated = jnp.concatenate([rotated, x32[..., rotating:]], axis=-1)
    return rotated.astype(x.dtype)


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

    def angles(self, positions: Int[Array, " seq"]) -> Float[Array, "seq rotary_dim"]:
        """The rotation angle of every position and dimension (each pair's angle twice)."""
        inv_freq = self.rope.frequencies_at(self.head_dim, positions)
        half = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
        return jnp.concatenate([half, half], axis=-1)

    def table(self, positions: Int[Array, " seq"]) -> RotaryTable:
        """cos and sin of `angles(positions)`, float32 `[seq, rotary_dim]` (longrope: times its
        attention factor): compute once, pass on."""
        angles = self.angles(positions)
        scale = self.rope.table_scale
        if scale == 1.0:
            return RotaryTable(jnp.cos(angles), jnp.sin(angles))
        factor = np.float32(scale)
        return RotaryTable(jnp.cos(angles) * factor, jnp.sin(angles) * factor)

    def __call__(
        self, x: Float[Array, "seq heads head_dim"], table: RotaryTable
    ) -> Float[Array, "seq heads head_dim"]:
        """`x` rotated by the `table` of its positions (`table(positions)`)."""
        return apply_rotary(x, table)
