"""Fields every flavor shares, their validation, and the helpers that build layers from them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import jax.numpy as jnp

from zoo.nn.embedding import POSITION_KINDS, SINUSOID_LAYOUTS
from zoo.nn.feedforward import ACTIVATIONS, FEED_FORWARD_KINDS
from zoo.nn.kernel import IMPLEMENTATIONS
from zoo.nn.norm import NORM_KINDS, Norm, make_norm
from zoo.nn.rotary import ROPE_SCALINGS, RotaryEmbedding
from zoo.nn.stack import LAYER_LOOPS, REMAT_CHOICES

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Hyperparameters shared by the classifier, the GPT and the translator."""

    # flavors whose model computes positions="relative" (T5's bias) set this
    relative_positions_supported: ClassVar[bool] = False

    vocab_size: int = 32000  # token ids are in [0, vocab_size)
    d_model: int = 512  # model width
    num_heads: int = 8  # attention (query) heads; must divide d_model unless head_dim is set
    num_kv_heads: int | None = None  # key/value heads (GQA, must divide num_heads); None: num_heads
    attention_head_dim: int | None = None  # per-head width; None: d_model // num_heads (Qwen3: 128)
    num_layers: int = 6  # transformer blocks (the encoder's, for a translator)
    d_ff: int = 2048  # hidden width of the position-wise feed-forward network
    feed_forward: str = "dense"  # dense | gated (act(gate) * up: SwiGLU with silu, GeGLU with gelu)
    max_positions: int = 512  # longest sequence the model accepts
    pad_id: int | None = 0  # padding token id; None: no padding (every position is real)
    dropout: float = 0.1  # dropout on embeddings, residual branches (and feed-forward hidden)
    attention_dropout: float = 0.1  # dropout on attention weights
    activation_dropout: float | None = None  # dropout on the feed-forward hidden (None: dropout)
    activation: str = "gelu"  # relu | gelu (erf) | gelu_tanh | silu
    norm: str = (
        "layernorm"  # layernorm | rmsnorm (Llama, Mistral, Qwen) in every block and at the end
    )
    norm_first: bool = True  # True: pre-norm (GPT-2, Llama); False: post-norm (the paper, BERT)
    layer_norm_eps: float = 1e-5  # epsilon of every norm (BERT uses 1e-12, Qwen 1e-6)
    use_bias: bool = True  # biases in attention and feed-forward projections
    qkv_bias: bool | None = None  # biases on query/key/value projections (Qwen2); None: use_bias
    attention_output_bias: bool | None = None  # bias on the attention output; None: use_bias
    feed_forward_bias: bool | None = None  # biases in the feed-forward; None: use_bias
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before rotary (Qwen3)
    scale_scores: bool = True  # divide attention scores by sqrt(head_dim); T5: False
    sliding_window: int | None = None  # decoder self-attention sees the last N positions (Mistral)
    positions: str = "learned"  # learned | sinusoidal (added) | rotary | relative (T5, translator)
    rope_theta: float = 10000.0  # rotary base: pair i turns by position * theta^(-2i/head_dim)
    rope_scaling: str | None = None  # None | linear | llama3: stretch rotary to longer contexts
    rope_factor: float = 1.0  # rotary scaling factor (linear and llama3)
    rope_low_freq_factor: float = 1.0  # llama3 scaling: wavelengths above original/low are scaled
    rope_high_freq_factor: float = 4.0  # llama3 scaling: wavelengths below original/high are kept
    rope_original_max_positions: int = 8192  # llama3 scaling: the context it was trained for
    sinusoid_layout: str = "interleaved"  # interleaved (the paper) | concatenated (Marian)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = False  # LayerNorm right after the embeddings (BERT)
    init_std: float = 0.02  # std of the normal init of weight matrices and embeddings
    layer_loop: str = "auto"  # auto (unrolled on a GPU, scanned elsewhere) | scan | unroll
    attention_implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    remat: str | None = None  # rematerialise in the backward: None | "dots" | "full" (zoo.nn.stack)
    dtype: str = "float32"  # parameter dtype

    def __post_init__(self) -> None:
        self._check_no_bools()
        positive = ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_positions")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.attention_head_dim is None and self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; pick "
                f"num_heads from the divisors of d_model, e.g. {_divisors(self.d_model)}, or "
                "set attention_head_dim"
            )
        self._check_attention_parts()
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
        if self.positions == "relative" and not self.relative_positions_supported:
            raise ValueError(
                f"positions='relative' (T5's relative position bias) is implemented for "
                f"zoo.Translator only, not {type(self).__name__}; choose learned, sinusoidal or "
                "rotary"
            )
        if self.positions == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention_implementation must be one of {IMPLEMENTATIONS} (None picks by "
                f"platform), got {self.attention_implementation!r}"
            )
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(
                f"layer_loop must be one of {LAYER_LOOPS} (auto: unrolled on a GPU, scanned "
                f"elsewhere), got {self.layer_loop!r}"
            )
        if self.remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {self.remat!r}")
        self._check_token_id("pad_id", self.pad_id)

    def _check_attention_parts(self) -> None:
        """Validate the fields that choose the modern parts (GQA, rotary, norms, gating)."""
        for name in ("num_kv_heads", "attention_head_dim", "sliding_window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.num_heads % self.kv_heads != 0:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}: each "
                "key/value head serves the same number of query heads; 1 is multi-query attention"
            )
        if self.norm not in NORM_KINDS:
            raise ValueError(f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
        if self.feed_forward not in FEED_FORWARD_KINDS:
            raise ValueError(
                f"feed_forward must be one of {FEED_FORWARD_KINDS}, got {self.feed_forward!r}"
            )
        if self.positions == "rotary" and self.head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(
                f"rope_scaling must be one of {ROPE_SCALINGS}, got {self.rope_scaling!r}"
            )
        if not self.rope_theta > 0 or not self.rope_factor > 0:
            raise ValueError(
                f"rope_theta and rope_factor must be positive, got {self.rope_theta}, "
                f"{self.rope_factor}"
            )
        if self.rope_scaling == "llama3" and not (
            0 < self.rope_low_freq_factor < self.rope_high_freq_factor
        ):
            raise ValueError(
                "llama3 rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
                f"{self.rope_low_freq_factor} and {self.rope_high_freq_factor}"
            )

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
        """Width of one attention head: `attention_head_dim`, else d_model // num_heads."""
        if self.attention_head_dim is not None:
            return self.attention_head_dim
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, else one per query head."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def rotary(self) -> RotaryEmbedding | None:
        """The rotary embedding the attention applies, or None for added positions."""
        if self.positions != "rotary":
            return None
        return RotaryEmbedding(
            self.head_dim,
            self.rope_theta,
            scaling=self.rope_scaling,
            factor=self.rope_factor,
            low_freq_factor=self.rope_low_freq_factor,
            high_freq_factor=self.rope_high_freq_factor,
            original_max_positions=self.rope_original_max_positions,
        )

    @property
    def scan_layers(self) -> bool | None:
        """`LayerStack`'s `scan`: True (scan), False (unroll), None (by platform)."""
        return {"auto": None, "scan": True, "unroll": False}[self.layer_loop]

    @property
    def param_dtype(self):
        return jnp.dtype(self.dtype)

    def block_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `zoo.nn.TransformerBlock` taken from this config."""
        return dict(
            activation=self.activation,
            gated=self.feed_forward == "gated",
            norm=self.norm,
            norm_first=self.norm_first,
            layer_norm_eps=self.layer_norm_eps,
            use_bias=self.use_bias,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.attention_head_dim,
            qkv_bias=self.qkv_bias,
            attention_output_bias=self.attention_output_bias,
            feed_forward_bias=self.feed_forward_bias,
            qk_norm=self.qk_norm,
            rotary=self.rotary(),
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            attention_implementation=self.attention_implementation,
            scale_scores=self.scale_scores,
            init_std=self.init_std,
            dtype=self.param_dtype,
        )

    def make_norm(self) -> Norm:
        """A norm of this config's kind and width (a model's final norm)."""
        return make_norm(self.norm, self.d_model, eps=self.layer_norm_eps, dtype=self.param_dtype)

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
        """The fields as JSON values (tuples as lists), equal to what `to_json` reads back as."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(self).items()
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        valid = {f.name for f in dataclasses.fields(cls)}
        data = _upgraded(data)
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}")
        # JSON has no tuples: list fields (stop_ids) come back as the tuples configs hold
        fields: dict[str, Any] = {
            name: tuple(value) if isinstance(value, list) else value for name, value in data.items()
        }
        return cls(**fields)


def _upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A config saved by an earlier zoo in today's fields: `scan_layers` (true was the default,
    so it means "auto"; false chose unrolled layers) became `layer_loop`."""
    if "scan_layers" not in data:
        return data
    data = dict(data)
    data["layer_loop"] = "auto" if data.pop("scan_layers") else "unroll"
    return data


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]
