"""Fields every flavor shares, their validation, and the helpers that build layers from them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jax.numpy as jnp

from zoo.nn.attention import AttentionSettings
from zoo.nn.block import BlockSettings
from zoo.nn.embedding import EmbedderSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.linear import Init
from zoo.nn.moe import MoESettings
from zoo.nn.norm import Norm, make_norm
from zoo.nn.rotary import Rope
from zoo.nn.stack import LAYER_LOOPS, REMAT_CHOICES, LayerPattern

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Hyperparameters shared by the classifier, the GPT and the translator.

    A model is built from the settings its parts take, resolved once from these fields
    (`embedder_settings`, `attention_settings`, `feed_forward_settings`, `block_settings`,
    `init`); a settings field has the name of the config field it comes from.
    """

    # flavors whose model computes positions="relative" (T5's bias) set this
    relative_positions_supported: ClassVar[bool] = False

    vocab_size: int = 32000  # token ids are in [0, vocab_size)
    d_model: int = 512  # model width
    num_heads: int = 8  # attention (query) heads; divide d_model unless attention_head_dim is set
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
    global_layers: tuple[int, ...] | None = None  # layers without the window (Gemma); None: none
    local_rope_theta: float | None = (
        None  # rope base of the windowed layers (Gemma 3); None: rope's
    )
    output_norm: bool = False  # norm each sub-layer's output before the sum (Gemma 2/3, OLMo 2)
    norm_weight_offset: float = 0.0  # RMSNorms scale by offset + weight (Gemma: 1.0)
    norm_bias: bool = True  # biases on the LayerNorms (ModernBERT: False)
    first_attention_norm: bool = True  # False: layer 0 has no norm before attention (ModernBERT)
    qk_norm_scope: str = "head"  # head (Qwen3, Gemma 3) | projection: all heads at once (OLMo 2)
    query_pre_attn_scalar: float | None = None  # scores times this ** -0.5 (Gemma); None: head_dim
    attention_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    positions: str = "learned"  # learned | sinusoidal (added) | rotary | relative (T5, translator)
    rope: Rope = field(default_factory=Rope)  # rotary base and scaling (positions="rotary")
    sinusoid_layout: str = "interleaved"  # interleaved (the paper) | concatenated (Marian)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = False  # LayerNorm right after the embeddings (BERT)
    init_std: float = 0.02  # std of the normal init of weight matrices and embeddings
    layer_loop: str = "auto"  # auto (unrolled on a GPU, scanned elsewhere) | scan | unroll
    attention_implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    remat: str | None = None  # recompute in the backward: None | dots | full | auto (zoo.nn.stack)
    dtype: str = "float32"  # parameter dtype
    # mixture of experts (zoo.nn.moe): each block's feed-forward routes every token to
    # num_experts_per_tok of num_experts gated experts; 0 experts: the dense feed-forward above
    num_experts: int = 0  # routed experts per layer (Mixtral's num_local_experts); 0: dense
    num_experts_per_tok: int = 2  # experts each token is sent to (top-k)
    moe_intermediate_size: int | None = None  # each expert's hidden width; None: d_ff
    shared_expert_intermediate_size: int = 0  # the shared expert's width (Qwen2-MoE); 0: none
    norm_topk_prob: bool = True  # renormalise the top-k router weights (Mixtral; not OLMoE)
    router: str = "softmax"  # softmax | sigmoid (DeepSeek-V3 style, with a selection bias)
    router_aux_loss_coef: float = 0.0  # load-balancing loss weight in the training objective
    router_z_loss_coef: float = 0.0  # router z-loss weight in the training objective
    moe_implementation: str = "ragged"  # ragged (grouped matmul) | dense (reference, slow)
    # dense layers among the experts (the dense feed-forward above, d_ff wide): a layer routes
    # unless one of these three makes it dense
    mlp_only_layers: tuple[int, ...] = ()  # indices of dense layers (Qwen's mlp_only_layers)
    decoder_sparse_step: int = 1  # layer i routes only when (i + 1) % step == 0 (Qwen); 1: all
    first_k_dense_replace: int = 0  # the first k layers are dense (DeepSeek)

    def __post_init__(self) -> None:
        """Check the fields, each in one place: the parts' settings check their own fields
        (under these names), and resolving them here makes a bad value fail as the config is
        made; the config checks the rest."""
        self._check_no_bools()
        for name in ("d_model", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or window <= 0):
            raise ValueError(f"sliding_window must be a positive integer or None, got {window!r}")
        if not isinstance(self.rope, Rope):
            raise ValueError(f"rope must be a zoo.nn.Rope, got {type(self.rope).__name__}")
        if self.global_layers is not None and not isinstance(self.global_layers, tuple):
            object.__setattr__(self, "global_layers", tuple(self.global_layers))  # JSON lists
        if not isinstance(self.mlp_only_layers, tuple):
            object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        self._check_dense_layers()
        self.layer_pattern()
        self.embedder_settings()
        self.block_settings()
        head_dim = self.head_dim  # d_model divisible by num_heads, unless attention_head_dim
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.positions == "relative" and not self.relative_positions_supported:
            raise ValueError(
                f"positions='relative' (T5's relative position bias) is implemented for "
                f"zoo.Translator only, not {type(self).__name__}; choose learned, sinusoidal or "
                "rotary"
            )
        if self.positions == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.positions == "rotary" and head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(
                f"layer_loop must be one of {LAYER_LOOPS} (auto: unrolled on a GPU, scanned "
                f"elsewhere), got {self.layer_loop!r}"
            )
        if self.remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {self.remat!r}")
        if not self.first_attention_norm and not self.norm_first:
            raise ValueError("first_attention_norm=False is for pre-norm models: set norm_first")
        self._check_token_id("pad_id", self.pad_id)

    def _check_dense_layers(self) -> None:
        """The dense-among-experts fields: in range, and only for a mixture of experts."""
        step, first = self.decoder_sparse_step, self.first_k_dense_replace
        if not isinstance(step, int) or step < 1:
            raise ValueError(f"decoder_sparse_step must be an integer >= 1, got {step!r}")
        if not isinstance(first, int) or first < 0:
            raise ValueError(f"first_k_dense_replace must be an integer >= 0, got {first!r}")
        outside = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ValueError(
                f"mlp_only_layers {outside} are not layers of a {self.num_layers}-layer model"
            )
        if (self.mlp_only_layers or step > 1 or first) and not self.num_experts:
            raise ValueError(
                "mlp_only_layers, decoder_sparse_step and first_k_dense_replace choose dense "
                "layers among mixture-of-experts ones: set num_experts, or leave them out"
            )
        if self.num_experts and not any(self.routed_layers()):
            raise ValueError(
                "every layer is dense (mlp_only_layers, decoder_sparse_step, "
                "first_k_dense_replace): set num_experts=0 for a dense model"
            )

    def routed_layers(self, num_layers: int | None = None) -> tuple[bool, ...]:
        """Whether each of the `num_layers` (default: the config's) layers routes to experts;
        all False for a dense model."""
        count = self.num_layers if num_layers is None else num_layers
        return tuple(
            bool(self.num_experts)
            and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0
            and i >= self.first_k_dense_replace
            for i in range(count)
        )

    def _check_no_bools(self) -> None:
        """A bool is an int to Python (`num_layers=True` is 1 layer): refuse it for number fields."""
        for one in dataclasses.fields(self):
            kind = str(one.type)
            value = getattr(self, one.name)
            if (
                isinstance(value, bool)
                and "bool" not in kind
                and ("int" in kind or "float" in kind)
            ):
                raise ValueError(
                    f"{one.name}={value!r} is a bool; {one.name} takes a number ({kind})"
                )

    def _check_token_id(self, name: str, value: int | None, vocab: int | None = None) -> None:
        vocab = self.vocab_size if vocab is None else vocab
        if value is not None and not 0 <= value < vocab:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {vocab})")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: `attention_head_dim`, else d_model // num_heads."""
        return self.attention_settings().width(self.d_model)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, else one per query head."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def scan_layers(self) -> bool | None:
        """`LayerStack`'s `scan`: True (scan), False (unroll), None (by platform)."""
        return {"auto": None, "scan": True, "unroll": False}[self.layer_loop]

    @property
    def param_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def init(self) -> Init:
        """How every part initialises its weights."""
        return Init(self.init_std, self.param_dtype)

    def attention_settings(self, *, cross: bool = False) -> AttentionSettings:
        """The self-attention's settings (with rotary positions where the model has them), or
        with `cross` a decoder's cross-attention's (never rotated)."""
        output_bias = self.attention_output_bias
        return AttentionSettings(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            attention_head_dim=self.attention_head_dim,
            qkv_bias=self.use_bias if self.qkv_bias is None else self.qkv_bias,
            attention_output_bias=self.use_bias if output_bias is None else output_bias,
            qk_norm=self.qk_norm,
            layer_norm_eps=self.layer_norm_eps,
            attention_dropout=self.attention_dropout,
            attention_implementation=self.attention_implementation,
            scale_scores=self.scale_scores,
            rope=self.rope if self.positions == "rotary" and not cross else None,
            qk_norm_scope=self.qk_norm_scope,
            norm_weight_offset=self.norm_weight_offset,
            query_pre_attn_scalar=self.query_pre_attn_scalar,
            attention_softcap=self.attention_softcap,
        )

    def feed_forward_settings(self) -> FeedForwardSettings:
        """The feed-forward's settings."""
        bias, dropout = self.feed_forward_bias, self.activation_dropout
        return FeedForwardSettings(
            d_ff=self.d_ff,
            activation=self.activation,
            kind=self.feed_forward,
            feed_forward_bias=self.use_bias if bias is None else bias,
            activation_dropout=self.dropout if dropout is None else dropout,
        )

    def moe_settings(self) -> MoESettings | None:
        """The mixture-of-experts feed-forward's settings; None for a dense model."""
        if not self.num_experts:
            return None
        width = self.moe_intermediate_size
        return MoESettings(
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.d_ff if width is None else width,
            shared_expert_intermediate_size=self.shared_expert_intermediate_size,
            norm_topk_prob=self.norm_topk_prob,
            router=self.router,
            activation=self.activation,
            router_aux_loss_coef=self.router_aux_loss_coef,
            router_z_loss_coef=self.router_z_loss_coef,
            implementation=self.moe_implementation,
        )

    def block_settings(
        self,
        *,
        cross_attention: bool = False,
        layer: int | None = None,
        num_layers: int | None = None,
    ) -> BlockSettings:
        """The settings of the blocks: their parts' own, resolved once from these fields; with
        `layer`, that layer's of a `num_layers` stack (a dense feed-forward among the experts,
        no attention norm on ModernBERT's layer 0)."""
        moe = self.moe_settings()
        if layer is not None and not self.routed_layers(num_layers)[layer]:
            moe = None
        return BlockSettings(
            attention=self.attention_settings(),
            feed_forward=moe or self.feed_forward_settings(),
            attention_norm=self.first_attention_norm or layer != 0,
            cross_attention=self.attention_settings(cross=True) if cross_attention else None,
            norm=self.norm,
            layer_norm_eps=self.layer_norm_eps,
            norm_first=self.norm_first,
            dropout=self.dropout,
            output_norm=self.output_norm,
            norm_weight_offset=self.norm_weight_offset,
            norm_bias=self.norm_bias,
        )

    def embedder_settings(self) -> EmbedderSettings:
        """The settings of the embedder (a translator's source embedder)."""
        return EmbedderSettings(
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            positions=self.positions,
            sinusoid_layout=self.sinusoid_layout,
            scale_embeddings=self.scale_embeddings,
            embedding_norm=self.embedding_norm,
            layer_norm_eps=self.layer_norm_eps,
            norm_bias=self.norm_bias,
            dropout=self.dropout,
        )

    def make_norm(self) -> Norm:
        """A norm of this config's kind and width (a model's final norm)."""
        return make_norm(
            self.norm,
            self.d_model,
            eps=self.layer_norm_eps,
            dtype=self.param_dtype,
            offset=self.norm_weight_offset,
            bias=self.norm_bias,
        )

    def layer_pattern(self) -> LayerPattern | None:
        """Which layers attend globally and how the windowed ones rotate (`global_layers`,
        `local_rope_theta`); None where every layer is alike."""
        if self.global_layers is None:
            if self.local_rope_theta is not None:
                raise ValueError("local_rope_theta is for the windowed layers: set global_layers")
            return None
        if self.sliding_window is None:
            raise ValueError(
                "global_layers drop the window on some layers: set sliding_window for the others"
            )
        local = self.local_rope_theta
        rope = None if local is None else Rope(theta=local)
        pattern = LayerPattern(global_layers=self.global_layers, local_rope=rope)
        pattern.is_global(self.num_layers)
        return pattern

    def replace(self, **changes: Any):
        """A copy with some fields changed; unknown field names raise with the valid ones.

        The rotary settings change as `rope=zoo.nn.Rope(...)` or field by field with the
        flat names `rope_theta`, `rope_scaling`, `rope_factor`, ... (`rope_` + a `Rope` field).
        """
        changes = _upgraded(changes, self.rope)
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


# the flat rotary fields of configs saved before `rope` was one value -> the `Rope` field
_FLAT_ROPE = {f"rope_{name.name}": name.name for name in dataclasses.fields(Rope)}


def _upgraded(data: dict[str, Any], rope: Rope | None = None) -> dict[str, Any]:
    """Fields in today's form from a saved config or overrides (of a config whose rotary
    settings are `rope`): `scan_layers` (true was the default, so it means "auto"; false chose
    unrolled layers) became `layer_loop`; the flat `rope_*` fields and a `rope` dict (JSON)
    became one `Rope`."""
    data = dict(data)
    if "scan_layers" in data:
        data["layer_loop"] = "auto" if data.pop("scan_layers") else "unroll"
    flat = {_FLAT_ROPE[name]: data.pop(name) for name in list(data) if name in _FLAT_ROPE}
    given = data.get("rope")
    if isinstance(given, dict):
        given = Rope(**given)
    if flat or given is not None:
        base = given if given is not None else (Rope() if rope is None else rope)
        data["rope"] = dataclasses.replace(base, **flat)
    return data
