"""Token, position and token-type (segment) embeddings for one sequence."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.linear import Init, legacy_init
from zoo.nn.norm import LayerNorm
from zoo.records import legacy_keywords

# learned and sinusoidal positions are added to the token embeddings; rotary positions are
# applied inside attention (zoo.nn.rotary) and relative ones are a bias on the attention scores
# (zoo.nn.relative_position, T5), so the embedder adds nothing for those two.
POSITION_KINDS = ("learned", "sinusoidal", "rotary", "relative")
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
    """What an `Embedder` is, besides its width and initialisation.

    A model's config resolves it (`config.embedder_settings()`); the fields carry the config's
    names and meanings.
    """

    vocab_size: int  # token ids are in [0, vocab_size)
    max_positions: int  # rows of the learned position table
    positions: str = "learned"  # learned | sinusoidal (added here) | rotary | relative (not here)
    sinusoid_layout: str = "interleaved"  # interleaved (the paper) | concatenated (Marian)
    scale_embeddings: bool = False  # token embeddings times sqrt(d_model)
    type_vocab_size: int = 0  # token types (segments); 0: none
    embedding_norm: bool = False  # LayerNorm after the sum (BERT)
    layer_norm_eps: float = 1e-5  # its epsilon
    norm_bias: bool = True  # the LayerNorm's bias (ModernBERT: none)
    dropout: float = 0.0  # on the embeddings
    own_tokens: bool = True  # False: the token table is another embedder's, passed in a call

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size!r}")
        if self.positions not in POSITION_KINDS:
            raise ValueError(f"positions must be one of {POSITION_KINDS}, got {self.positions!r}")
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}, got {self.sinusoid_layout!r}"
            )


# the loose keywords of `Embedder` before `EmbedderSettings` -> the settings' fields
_OLDER_KEYWORDS = {
    "vocab_size": "vocab_size",
    "max_positions": "max_positions",
    "position_kind": "positions",
    "sinusoid_layout": "sinusoid_layout",
    "scale_tokens": "scale_embeddings",
    "type_vocab_size": "type_vocab_size",
    "use_norm": "embedding_norm",
    "norm_eps": "layer_norm_eps",
    "dropout_rate": "dropout",
    "own_tokens": "own_tokens",
}


def _older_call(
    first: int, second: int | None, more: tuple[int, ...], legacy: dict[str, Any]
) -> tuple[int, EmbedderSettings, Init]:
    """(d_model, settings, init) of a call in the older form
    `Embedder(vocab_size, d_model, max_positions, *, position_kind=..., ..., key=...)`."""
    if second is None:  # everything by keyword: `first` is d_model
        given, d_model = dict(legacy), first
    elif len(more) > 1:
        raise TypeError(f"Embedder() takes at most 3 positional sizes, got {2 + len(more)}")
    else:  # positional vocab_size, d_model[, max_positions]
        sizes = dict(zip(("max_positions",), more, strict=False))
        given, d_model = {"vocab_size": first, **sizes, **legacy}, second
    older = legacy_keywords(
        "Embedder",
        given,
        (*_OLDER_KEYWORDS, "init_std", "dtype"),
        "Embedder(d_model, EmbedderSettings(...), init=Init(...))",
    )
    fields = {new: older[name] for name, new in _OLDER_KEYWORDS.items() if name in older}
    init = Init(older.get("init_std", Init.std), older.get("dtype", Init.dtype))
    return d_model, EmbedderSettings(**fields), init


class Embedder(eqx.Module):
    """Token embedding (optionally scaled by sqrt(d_model)) + positions + token types.

    Optionally followed by LayerNorm (BERT) and dropout, as its `EmbedderSettings` say; tables
    drawn as `init` says. With `own_tokens=False` the token table is passed in each call
    (`token_weight`), shared with another embedder (a translator with shared embeddings).

    The older call `Embedder(vocab_size, d_model, max_positions, position_kind=..., ...,
    init_std=..., dtype=..., key=...)` still works, with a DeprecationWarning.
    """

    token_weight: Float[Array, "vocab d_model"] | None
    position_weight: Float[Array, "max_positions d_model"] | None
    token_type_weight: Float[Array, "types d_model"] | None
    norm: LayerNorm | None
    dropout: Dropout
    vocab_size: int = eqx.field(static=True)
    d_model: int = eqx.field(static=True)
    max_positions: int = eqx.field(static=True)
    positions: str = eqx.field(static=True)
    sinusoid_layout: str = eqx.field(static=True)
    scale: float = eqx.field(static=True)

    def __init__(
        self,
        d_model: int,
        settings: EmbedderSettings | int | None = None,
        *older: int,
        init: Init | None = None,
        key: PRNGKeyArray,
        **legacy: Any,
    ):
        if isinstance(settings, EmbedderSettings) and not older:
            init = legacy_init("Embedder", init, legacy)
        elif init is None and (isinstance(settings, int) or (settings is None and legacy)):
            d_model, settings, init = _older_call(d_model, settings, older, legacy)
        else:
            raise TypeError("Embedder takes (d_model, EmbedderSettings(...), *, init=None, key)")
        s = settings
        tok_key, pos_key, type_key = jax.random.split(key, 3)
        learned = s.positions == "learned"
        self.token_weight = init.normal(tok_key, (s.vocab_size, d_model)) if s.own_tokens else None
        self.position_weight = init.normal(pos_key, (s.max_positions, d_model)) if learned else None
        self.token_type_weight = (
            init.normal(type_key, (s.type_vocab_size, d_model)) if s.type_vocab_size > 0 else None
        )
        self.norm = None
        if s.embedding_norm:
            self.norm = LayerNorm(d_model, eps=s.layer_norm_eps, dtype=init.dtype, bias=s.norm_bias)
        self.dropout = Dropout(s.dropout)
        self.vocab_size = s.vocab_size
        self.d_model = d_model
        self.max_positions = s.max_positions
        self.positions = s.positions
        self.sinusoid_layout = s.sinusoid_layout
        self.scale = math.sqrt(d_model) if s.scale_embeddings else 1.0

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
