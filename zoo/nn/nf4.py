"""`NF4Linear`: a frozen `Linear` stored in 4-bit NormalFloat (QLoRA's NF4), as bitsandbytes
stores it with `quant_type="nf4"` and `compress_statistics=True`.

The weight, flattened row-major, is cut into blocks of 64 values. Each block is divided by its
absmax and each value replaced by the index of the nearest of the 16 NF4 levels (`NF4_LEVELS`,
quantiles of a normal distribution), two indices a byte (the first in the high half). The block
absmaxes are quantized again ("double quantization"): their mean is taken off, and the rest is
cut into blocks of 256, each divided by its own absmax and stored as the index of the nearest
of bitsandbytes' 256 signed dynamic 8-bit levels (`dynamic_levels`). A weight then costs half a
byte, plus one byte per 64 values and 4 bytes per 16,384: about 0.52 bytes, against int8's 1
and float32's 4.

The call rebuilds the float weight from the codes (`level * absmax`, the absmax itself
`level8 * absmax2 + offset`) in the input's dtype and multiplies by it; XLA fuses the lookup
into the matmul's operand. Integer codes are not parameters; the float32 second-level scales
sit behind the LoRA layer's `stop_gradient`, as int8's scales do.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Float, UInt8

from zoo.nn.linear import Linear

BLOCK = 64  # weights per absmax (bitsandbytes' default blocksize for 4-bit)
SCALE_BLOCK = 256  # absmaxes per second-level scale (bitsandbytes' compress_statistics)
# The 16 NF4 levels, as published with QLoRA and hard-coded in bitsandbytes (float32).
NF4_LEVELS = np.array(
    [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
     0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
     0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0],
    np.float32,
)  # fmt: skip


def _linspace(count: int) -> np.ndarray:
    """`torch.linspace(0.1, 1, count)` in float32, value for value (each point rounded once,
    the first half counted from the start, the second from the end)."""
    start, end = np.float32(0.1), np.float32(1.0)
    step = np.float32((end - start) / np.float32(count - 1))
    index = np.arange(count)
    low = (np.float64(start) + np.float64(step) * index).astype(np.float32)
    high = (np.float64(end) - np.float64(step) * (count - 1 - index)).astype(np.float32)
    return np.where(index < count // 2, low, high)


def dynamic_levels() -> np.ndarray:
    """bitsandbytes' signed dynamic 8-bit levels (`create_dynamic_map()`), float32, sorted: for
    each exponent 10^-6 ... 10^0, the midpoints of a linear grid of 2^i + 1 points in [0.1, 1]
    times it, both signs, then 0 and 1."""
    levels = [np.float32(0.0), np.float32(1.0)]
    for i in range(7):
        grid = _linspace(2**i + 1)
        means = ((grid[:-1] + grid[1:]) / np.float32(2)).astype(np.float32)
        power = np.float32(10.0 ** (i - 6))
        levels.extend([*(power * means), *(-power * means)])
    return np.sort(np.asarray(levels, np.float32))


def _nearest(scaled: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The index of the nearest of the sorted `levels` to each value (ties to the upper)."""
    bounds = (levels[:-1] + levels[1:]) / np.float32(2)
    return np.searchsorted(bounds, scaled, side="left").astype(np.uint8)


def _blockwise(values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`values` (padded with zeros to whole blocks of `size`) divided by each block's absmax,
    clipped to [-1, 1], and the absmaxes."""
    padded = np.zeros(-(-values.size // size) * size, np.float32)
    padded[: values.size] = values
    blocks = padded.reshape(-1, size)
    absmax = np.abs(blocks).max(axis=1)
    scaled = np.clip(blocks * (np.float32(1) / np.maximum(absmax, np.float32(1e-38)))[:, None],
                     -1, 1)  # fmt: skip
    return scaled.reshape(-1), absmax


def quantize_nf4(weight: np.ndarray) -> dict[str, np.ndarray]:
    """One weight matrix's NF4 codes (see the module doc): `codes` (two a byte), `scale_codes`
    (one per 64 values), `scale_absmax` (one per 256 blocks) and `scale_offset` (a scalar)."""
    flat = np.asarray(weight, np.float32).reshape(-1)
    scaled, absmax = _blockwise(flat, BLOCK)
    indices = _nearest(scaled, NF4_LEVELS)
    codes = (indices[0::2] << 4) | indices[1::2]
    offset = np.float32(absmax.mean(dtype=np.float32))
    scaled_absmax, absmax2 = _blockwise(absmax - offset, SCALE_BLOCK)
    scale_codes = _nearest(scaled_absmax, dynamic_levels())[: absmax.size]
    return {"codes": codes, "scale_codes": scale_codes, "scale_absmax": absmax2,
            "scale_offset": np.asarray(offset, np.float32)}  # fmt: skip


class NF4Linear(eqx.Module):
    """`Linear` with its weight in NF4 (see the module doc); the same call. Arrays carry a
    leading `layers` axis inside a layer stack."""

    codes: UInt8[Array, "*layers half_blocks"]  # NF4 indices, two a byte, high half first
    scale_codes: UInt8[Array, "*layers blocks"]  # each block's absmax, as a dynamic 8-bit level
    scale_absmax: Float[Array, "*layers scale_blocks"]  # the absmax of 256 blocks' absmaxes
    scale_offset: Float[Array, "*layers"]  # the mean block absmax, taken off before that
    bias: Float[Array, "*layers out_features"] | None
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading (stacked `layers`) axes."""
        return tuple(self.codes.shape[:-1])

    @staticmethod
    def from_linear(linear: Linear) -> NF4Linear:
        """The NF4 codes of `linear`'s weight (each stacked layer's on its own); zeros of their
        shapes while traced (`eqx.filter_eval_shape` of a skeleton, which `zoo.load` fills)."""
        if isinstance(linear.weight, jax.core.Tracer):
            return NF4Linear._placeholder(linear)
        weight = np.asarray(linear.weight, np.float32)
        lead = weight.shape[:-2]
        layers = [quantize_nf4(w) for w in weight.reshape(-1, *weight.shape[-2:])]

        def stacked(name: str) -> Array:
            arrays = np.stack([layer[name] for layer in layers])
            return jnp.asarray(arrays.reshape((*lead, *arrays.shape[1:])))

        return NF4Linear(
            stacked("codes"), stacked("scale_codes"), stacked("scale_absmax"),
            stacked("scale_offset"), linear.bias, linear.in_features, linear.out_features,
        )  # fmt: skip

    @staticmethod
    def _placeholder(linear: Linear) -> NF4Linear:
        lead = linear.weight.shape[:-2]
        blocks = -(-linear.in_features * linear.out_features // BLOCK)
        return NF4Linear(
            jnp.zeros((*lead, blocks * BLOCK // 2), jnp.uint8), jnp.zeros((*lead, blocks), jnp.uint8),
            jnp.zeros((*lead, -(-blocks // SCALE_BLOCK)), jnp.float32), jnp.zeros(lead, jnp.float32),
            linear.bias, linear.in_features, linear.out_features,
        )  # fmt: skip

    def dequantized(self, dtype: DTypeLike = jnp.float32) -> Float[Array, "*layers out in"]:
        """The dequantized weight: `NF4[code] * absmax`, `absmax = level8 * absmax2 + offset`."""
        levels8 = jnp.asarray(dynamic_levels())
        absmax2 = jnp.repeat(self.scale_absmax, SCALE_BLOCK, axis=-1)
        absmax2 = absmax2[..., : self.scale_codes.shape[-1]]
        absmax = levels8[self.scale_codes] * absmax2 + self.scale_offset[..., None]
        indices = jnp.stack([self.codes >> 4, self.codes & 15], axis=-1)
        values = jnp.asarray(NF4_LEVELS)[indices.reshape(*self.codes.shape[:-1], -1, BLOCK)]
        flat = (values * absmax[..., None]).reshape(*self.codes.shape[:-1], -1)
        size = self.out_features * self.in_features
        shape = (*self.codes.shape[:-1], self.out_features, self.in_features)
        return flat[..., :size].reshape(shape).astype(dtype)

    def dequantize(self, dtype: DTypeLike = jnp.float32) -> Linear:
        """A float `Linear` with the dequantized weight (what this layer computes)."""
        use_bias = self.bias is not None
        shell = eqx.filter_eval_shape(
            Linear, self.in_features, self.out_features, use_bias=use_bias, key=jax.random.key(0)
        )
        weight = self.dequantized(dtype)
        if not use_bias:
            return eqx.tree_at(lambda linear: linear.weight, shell, weight)
        return eqx.tree_at(lambda linear: (linear.weight, linear.bias), shell, (weight, self.bias))

    def __call__(self, x: Float[Array, "*lead in_features"]) -> Float[Array, "*lead out_features"]:
        y = x @ self.dequantized(x.dtype).T
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (-1,)).astype(y.dtype)
        return y
