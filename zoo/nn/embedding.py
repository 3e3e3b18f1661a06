"""Token, position and token-type (segment) embeddings for one sequence."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Init
from zoo.nn.norm import Norm, NormSettings

# learned and sinusoidal positions are added to the token embeddings; rotary positions are
# applied inside attention (zoo.nn.rotary) and relative ones are a bias on the attention scores
# (zoo.nn.relative_position, T5), so the embedder adds nothing for those two.
POSITION_KINDS = ("learned", "sinusoidal", "none")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")


# True while tracing a program whose every token id was checked on the host before it runs
_IDS_CHECKED_ON_HOST = contextvars.ContextVar("ids_checked_on_host", default=False)


@contextlib.contextmanager
def ids_checked_on_host(checked: bool = True) -> Iterator[None]:
    """Trace the code inside without the on-device token-id check of `check_token_ids`.

    Only for a program whose caller checks every batch's ids against the vocabulary on the host
    before running it (the Trainer's train and eval steps, `Task.check_batch`). The on-device
    check is an `eqx.error_if`, a host callback, and JAX does not keep programs with host
    callbacks in its persistent compilation cache. `checked=False` leaves the check on.
    """
    token = _IDS_CHECKED_ON_HOST.set(checked)
    try:
        yield
    finally:
        _IDS_CHECKED_ON_HOST.reset(token)


def checked_on_host() -> bool:
    """Whether the code being traced runs inside `ids_checked_on_host()`: its caller checks each
    batch on the host, so checks on the device (host callbacks) are left out."""
    return _IDS_CHECKED_ON_HOST.get()


def check_token_ids(tokens: Int[Array, " seq"], vocab_size: int, what: str = "token") -> Array:
    """Raise (also under jit) if a token id is outside `[0, vocab_size)`.

    JAX clamps out-of-range gathers silently, which would give a wrong answer instead of an error.
    Inside `ids_checked_on_host()` the ids were checked before the program runs: no check here.
    """
    if _IDS_CHECKED_ON_HOST.get():
        return tokens
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


@dataclass(frozen=True, kw_only=True)
class EmbedderSettings:
    """What an `Embedder` is, besides its sizes (vocabulary, width, positions) and
    initialisation."""

    positions: str = "learned"  # learned | sinusoidal (added here) | none (rotary, relative)
    sinusoid_layout: str = "interleaved"  # interleaved (the paper) | concatenated (Marian)
    scale: bool = False  # token embeddings times sqrt(d_model) (the paper, T5 no, Gemma yes)
    norm: NormSettings | None = None  # a norm after the sum (BERT's LayerNorm); None: none
    dropout: float = 0.0  # on the embeddings
    type_vocab_size: int = 0  # token types (segments, BERT: 2); 0: none
    position_offset: int = 0  # RoBERTa: real tokens' positions count from here (pad_id + 1)

    def __post_init__(self) -> None:
        for name in ("type_vocab_size", "position_offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.positions not in POSITION_KINDS:
            raise ValueError(
                f"embedder positions must be one of {POSITION_KINDS} (rotary positions are the "
                f"attention's `rope`), got {self.positions!r}"
            )
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}, got {self.sinusoid_layout!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"embedding dropout must be in [0, 1), got {self.dropout}")


class Embedder(eqx.Module):
    """Token embedding (optionally scaled by sqrt(d_model)) + positions + token types.

    Optionally followed by a norm (BERT) and dropout, as its `EmbedderSettings` say; tables
    drawn as `init` says. With `own_tokens=False` the token table is passed in each call
    (`token_weight`), shared with another embedder (a translator with shared embeddings).
    """

    token_weight: Float[Array, "vocab d_model"] | None
    position_weight: Float[Array, "max_positions d_model"] | None
    token_type_weight: Float[Array, "types d_model"] | None
    norm: Norm | None
    dropout: Dropout
    vocab_size: int = eqx.field(static=True)
    d_model: int = eqx.field(static=True)
    max_positions: int = eqx.field(static=True)
    positions: str = eqx.field(static=True)
    sinusoid_layout: str = eqx.field(static=True)
    scale: float = eqx.field(static=True)

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_positions: int,
        settings: EmbedderSettings | None = None,
        *,
        own_tokens: bool = True,
        init: Init | None = None,
        key: PRNGKeyArray,
    ):
        """An embedder of `vocab_size` tokens into `d_model` wide vectors.

        Args:
            vocab_size: token ids are in `[0, vocab_size)`.
            d_model: the width of the embeddings.
            max_positions: rows of the learned position table (the longest input).
            settings: positions, scaling, norm, dropout, token types (default: learned
                positions and nothing else).
            own_tokens: False: no token table here; each call passes another's.
            init: how the tables are drawn (default `Init()`).
            key: the tables' random key.
        """
        s = EmbedderSettings() if settings is None else settings
        init = Init() if init is None else init
        for name, value in (("vocab_size", vocab_size), ("max_positions", max_positions)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        tok_key, pos_key, type_key = jax.random.split(key, 3)
        learned = s.positions == "learned"
        self.token_weight = init.normal(tok_key, (vocab_size, d_model)) if own_tokens else None
        self.position_weight = init.normal(pos_key, (max_positions, d_model)) if learned else None
        self.token_type_weight = (
            init.normal(type_key, (s.type_vocab_size, d_model)) if s.type_vocab_size > 0 else None
        )
        self.norm = None if s.norm is None else s.norm.make(d_model, init.dtype)
        self.dropout = Dropout(s.dropout)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_positions = max_positions
        self.positions = s.positions
        self.sinusoid_layout = s.sinusoid_layout
        self.scale = math.sqrt(d_model) if s.scale else 1.0

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
        elif self.positions == "sinusoidal":
            x = x + sinusoidal_positions(
                positions, self.d_model, layout=self.sinusoid_layout
            ).astype(x.dtype)
        if self.token_type_weight is not None:
            types = jnp.zeros_like(tokens) if token_types is None else token_types
            x = x + self.token_type_weight[types]
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x, key=key)
