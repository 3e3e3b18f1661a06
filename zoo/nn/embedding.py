"""Token, position and token-type (segment) embeddings for one sequence."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.norm import LayerNorm

# learned and sinusoidal positions are added to the token embeddings; rotary positions are
# applied inside attention (zoo.nn.rotary) and relative ones are a bias on the attention scores
# (zoo.nn.relative_position, T5), so the embedder adds nothing for those two.
POSITION_KINDS = ("learned", "sinusoidal", "rotary", "relative")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")


def check_token_ids(tokens: Int[Array, " seq"], vocab_size: int, what: str = "token") -> Array:
    """Raise (also under jit) if a token id is outside `[0, vocab_size)`.

    JAX clamps out-of-range gathers silently, which would give a wrong answer instead of an error.
    """
    bad = jnp.any((tokens < 0) | (tokens >= vocab_size))
    return eqx.error_if(
        tokens,
        bad,
        f"{what} id outside [0, {vocab_size}): the tokenizer and the model disagree on the "
        f"vocabulary; build the model with vocab_size >= the tokenizer's vocabulary size",
    )


def sinusoidal_positions(
    positions: Int[Array, " seq"], dim: int, *, layout: str = "interleaved"
) -> Float[Array, "seq dim"]:
    """The fixed position encoding of "Attention is all you need".

    `PE[p, 2i] = sin(p / 10000^(2i/dim))` and `PE[p, 2i+1] = cos(p / 10000^(2i/dim))` with
    layout "interleaved" (the paper); "concatenated" puts all sines first, then all cosines
    (tensor2tensor, fairseq and MarianMT).
    """
    if dim % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even dimension, got {dim}")
    if layout not in SINUSOID_LAYOUTS:
        raise ValueError(f"unknown sinusoid layout {layout!r}; choose one of {SINUSOID_LAYOUTS}")
    half = dim // 2
    inv_freq = jnp.exp(-math.log(10000.0) * (2.0 * jnp.arange(half, dtype=jnp.float32) / dim))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    if layout == "concatenated":
        return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(positions.shape[0], dim)


class Embedder(eqx.Module):
    """Token embedding (optionally scaled by sqrt(d_model)) + positions + token types.

    Optionally followed by LayerNorm (BERT) and dropout. `token_weight` may be passed in to share
    one token table between two embedders (a translator with shared embeddings).
    """

    token_weight: Float[Array, "vocab d_model"] | None
    position_weight: Float[Array, "max_positions d_model"] | None
    token_type_weight: Float[Array, "types d_model"] | None
    norm: LayerNorm | None
    dropout: Dropout
    vocab_size: int = eqx.field(static=True)
    d_model: int = eqx.field(static=True)
    max_positions: int = eqx.field(static=True)
    position_kind: str = eqx.field(static=True)
    sinusoid_layout: str = eqx.field(static=True)
    scale: float = eqx.field(static=True)

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_positions: int,
        *,
        position_kind: str = "learned",
        sinusoid_layout: str = "interleaved",
        scale_tokens: bool = False,
        type_vocab_size: int = 0,
        use_norm: bool = False,
        norm_eps: float = 1e-5,
        dropout_rate: float = 0.0,
        own_tokens: bool = True,
        init_std: float = 0.02,
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        if position_kind not in POSITION_KINDS:
            raise ValueError(f"unknown position kind {position_kind!r}; choose {POSITION_KINDS}")
        tok_key, pos_key, type_key = jax.random.split(key, 3)

        def table(k, rows):
            return (init_std * jax.random.normal(k, (rows, d_model))).astype(dtype)

        self.token_weight = table(tok_key, vocab_size) if own_tokens else None
        self.position_weight = table(pos_key, max_positions) if position_kind == "learned" else None
        self.token_type_weight = table(type_key, type_vocab_size) if type_vocab_size > 0 else None
        self.norm = LayerNorm(d_model, eps=norm_eps, dtype=dtype) if use_norm else None
        self.dropout = Dropout(dropout_rate)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_positions = max_positions
        self.position_kind = position_kind
        self.sinusoid_layout = sinusoid_layout
        self.scale = math.sqrt(d_model) if scale_tokens else 1.0

    def __call__(
        self,
        tokens: Int[Array, " seq"],
        positions: Int[Array, " seq"],
        token_types: Int[Array, " seq"] | None = None,
        *,
        token_weight: Float[Array, "vocab d_model"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq d_model"]:
        table = self.token_weight if token_weight is None else token_weight
        if table is None:
            raise ValueError("this embedder shares its token table: pass token_weight")
        x = table[tokens] * self.scale if self.scale != 1.0 else table[tokens]
        if self.position_weight is not None:
            x = x + self.position_weight[positions]
        elif self.position_kind == "sinusoidal":
            x = x + sinusoidal_positions(
                positions, self.d_model, layout=self.sinusoid_layout
            ).astype(x.dtype)
        if self.token_type_weight is not None:
            types = jnp.zeros_like(tokens) if token_types is None else token_types
            x = x + self.token_type_weight[types]
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x, key=key)
