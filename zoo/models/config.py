"""Fields every flavor shares, their validation, and the helpers that build layers from them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from zoo.nn.embedding import POSITION_KINDS, SINUSOID_LAYOUTS
from zoo.nn.feedforward import ACTIVATIONS
from zoo.nn.stack import REMAT_CHOICES

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Hyperparameters shared by the classifier, the GPT and the translator."""

    vocab_size: int = 32000  # token ids are in [0, vocab_size)
    d_model: int = 512  # model width
    num_heads: int = 8  # attention heads; must divide d_model
    num_layers: int = 6  # transformer blocks (the encoder's, for a translator)
    d_ff: int = 2048  # hidden width of the position-wise feed-forward network
    max_positions: int = 512  # longest sequence the model accepts
    pad_id: int | None = 0  # padding token id; None: no padding (every position is real)
    dropout: float = 0.1  # dropout on embeddings, residual branches (and feed-forward hidden)
    attention_dropout: float = 0.1  # dropout on attention weights
    activation_dropout: float | None = None  # dropout on the feed-forward hidden (None: dropout)
    activation: str = "gelu"  # relu | gelu (erf) | gelu_tanh | silu
    norm_first: bool = True  # True: pre-LN (GPT-2); False: post-LN (the paper, BERT)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (BERT uses 1e-12)
    use_bias: bool = True  # biases in attention and feed-forward projections
    positions: str = "learned"  # learned | sinusoidal
    sinusoid_layout: str = "interleaved"  # interleaved (the paper) | concatenated (Marian)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = False  # LayerNorm right after the embeddings (BERT)
    init_std: float = 0.02  # std of the normal init of weight matrices and embeddings
    scan_layers: bool = True  # run layers with lax.scan (fast compile); False unrolls them
    attention_implementation: str | None = None  # jax.nn.dot_product_attention: None|xla|cudnn
    remat: str | None = None  # rematerialise in the backward: None | "dots" | "full" (zoo.nn.stack)
    dtype: str = "float32"  # parameter dtype

    def __post_init__(self) -> None:
        self._check_no_bools()
        positive = ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_positions")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; pick "
                f"num_heads from the divisors of d_model, e.g. {_divisors(self.d_model)}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; choose one of {sorted(ACTIVATIONS)}"
            )
        if self.positions not in POSITION_KINDS:
            raise ValueError(f"positions must be one of {POSITION_KINDS}, got {self.positions!r}")
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}, got {self.sinusoid_layout!r}"
            )
        if self.positions == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_implementation not in (None, "xla", "cudnn"):
            raise ValueError(
                "attention_implementation must be None, 'xla' or 'cudnn', "
                f"got {self.attention_implementation!r}"
            )
        if self.remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {self.remat!r}")
        self._check_token_id("pad_id", self.pad_id)

    def _check_no_bools(self) -> None:
        """A bool is an int to Python (`num_layers=True` is 1 layer): refuse it for number fields."""
        for field in dataclasses.fields(self):
            kind = str(field.type)
            value = getattr(self, field.name)
            if (
                isinstance(value, bool)
                and "bool" not in kind
                and ("int" in kind or "float" in kind)
            ):
                raise ValueError(
                    f"{field.name}={value!r} is a bool; {field.name} takes a number ({kind})"
                )

    def _check_token_id(self, name: str, value: int | None, vocab: int | None = None) -> None:
        vocab = self.vocab_size if vocab is None else vocab
        if value is not None and not 0 <= value < vocab:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {vocab})")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.num_heads

    @property
    def param_dtype(self):
        return jnp.dtype(self.dtype)

    def block_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `zoo.nn.TransformerBlock` taken from this config."""
        return dict(
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_eps=self.layer_norm_eps,
            use_bias=self.use_bias,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            attention_implementation=self.attention_implementation,
            init_std=self.init_std,
            dtype=self.param_dtype,
        )

    def embedder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `zoo.nn.Embedder` taken from this config."""
        return dict(
            position_kind=self.positions,
            sinusoid_layout=self.sinusoid_layout,
            scale_tokens=self.scale_embeddings,
            use_norm=self.embedding_norm,
            norm_eps=self.layer_norm_eps,
            dropout_rate=self.dropout,
            init_std=self.init_std,
            dtype=self.param_dtype,
        )

    def replace(self, **changes: Any):
        """A copy with some fields changed; unknown field names raise with the valid ones."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no field(s) {unknown}; valid fields: {sorted(valid)}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}")
        return cls(**data)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]
