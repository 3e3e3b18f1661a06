"""Mixture-of-experts presets: Mixtral, Qwen3-MoE, Qwen2-MoE (Qwen1.5-MoE) and OLMoE.

Each is a Llama-style decoder whose feed-forward is a mixture of experts (`zoo.nn.moe`); the
`-tiny` ones are for tests. `zoo.presets` registers every one of `MOE_PRESETS`.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from zoo.models import GPT, GPTConfig
from zoo.nn.rotary import Rope

# name -> (config, description); `zoo.presets` registers them
MOE_PRESETS: dict[str, tuple[GPTConfig, str]] = {}
# the Llama-style parts every one shares (zoo.presets.LLAMA_PARTS), with an untied head
_PARTS: dict[str, Any] = dict(
    norm="rmsnorm",
    positions="rotary",
    feed_forward="gated",
    activation="silu",
    use_bias=False,
    pad_id=None,
    dropout=0.0,
    attention_dropout=0.0,
    tie_embeddings=False,
)


def _register(name: str, config: GPTConfig, description: str) -> None:
    """Add a preset to `MOE_PRESETS`."""
    MOE_PRESETS[name] = (config, description)


# the tiny ones: 2 layers of 4 experts, top-2, small enough for a test
_TINY_MOE: dict[str, Any] = dict(
    vocab_size=64,
    d_model=64,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    d_ff=64,
    max_positions=128,
    num_experts=4,
    num_experts_per_tok=2,
    bos_id=1,
    eos_id=2,
    pad_id=0,
    remat="dots",  # as the other CPU test presets
)
QWEN_TOKENS: dict[str, Any] = dict(vocab_size=151936, bos_id=151643)


def _moe(**fields: Any) -> GPTConfig:
    return GPTConfig(**{**_PARTS, **fields})


MIXTRAL: dict[str, Any] = dict(router_aux_loss_coef=0.02, rope=Rope(theta=1000000.0))
QWEN3_MOE: dict[str, Any] = dict(
    qk_norm=True, router_aux_loss_coef=0.001, rope=Rope(theta=1000000.0), layer_norm_eps=1e-6
)
QWEN2_MOE: dict[str, Any] = dict(
    qkv_bias=True,  # Qwen2: biases on q/k/v only
    norm_topk_prob=False,
    router_aux_loss_coef=0.001,
    rope=Rope(theta=1000000.0),
    layer_norm_eps=1e-6,
)
OLMOE: dict[str, Any] = dict(
    qk_norm=True,
    qk_norm_scope="projection",  # RMSNorm over the whole query and key projections
    norm_topk_prob=False,
    router_aux_loss_coef=0.01,
)

_register(
    "mixtral-8x7b",
    _moe(
        vocab_size=32000,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        num_layers=32,
        d_ff=14336,
        num_experts=8,
        num_experts_per_tok=2,
        max_positions=32768,
        bos_id=1,
        eos_id=2,
        **MIXTRAL,
    ),
    "Mixtral 8x7B shapes: 8 experts of width 14336, top-2 (46.7B, 12.9B active)",
)
_register(
    "qwen3-30b-a3b",
    _moe(
        d_model=2048,
        num_heads=32,
        num_kv_heads=4,
        attention_head_dim=128,
        num_layers=48,
        d_ff=6144,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        max_positions=40960,
        eos_id=151645,
        **QWEN_TOKENS,
        **QWEN3_MOE,
    ),
    "Qwen3-30B-A3B shapes: 128 experts of width 768, top-8, QK-norm (30.5B, 3.3B active)",
)
_register(
    "qwen2-moe-a2.7b",
    _moe(
        d_model=2048,
        num_heads=16,
        num_layers=24,
        d_ff=5632,
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        max_positions=8192,
        eos_id=151643,
        **QWEN_TOKENS,
        **QWEN2_MOE,
    ),
    "Qwen1.5-MoE-A2.7B shapes: 60 experts of width 1408, top-4, a gated shared expert (14.3B)",
)
_register(
    "olmoe-1b-7b",
    _moe(
        vocab_size=50304,
        d_model=2048,
        num_heads=16,
        num_layers=16,
        d_ff=1024,
        num_experts=64,
        num_experts_per_tok=8,
        max_positions=4096,
        pad_id=1,
        eos_id=50279,
        **OLMOE,
    ),
    "OLMoE-1B-7B shapes: 64 experts of width 1024, top-8, whole-projection QK-norm (6.9B)",
)
_register(
    "mixtral-tiny",
    _moe(**_TINY_MOE, **MIXTRAL),
    "2-layer Mixtral-style decoder, 4 experts, top-2, for tests",
)
_register(
    "qwen3-moe-tiny",
    _moe(**{**_TINY_MOE, "moe_intermediate_size": 32, **QWEN3_MOE}),
    "2-layer Qwen3-MoE-style decoder (QK-norm), 4 experts of width 32, top-2, for tests",
)
_register(
    "qwen2-moe-tiny",
    _moe(
        **{**_TINY_MOE, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 96},
        **QWEN2_MOE,
    ),
    "2-layer Qwen2-MoE-style decoder with a gated shared expert, 4 experts, for tests",
)
_register(
    "qwen3-moe-mixed-tiny",
    _moe(
        **{**_TINY_MOE, "num_layers": 4, "moe_intermediate_size": 32, **QWEN3_MOE},
        decoder_sparse_step=2,
        mlp_only_layers=(3,),
    ),
    "4-layer Qwen3-MoE-style decoder, dense layers 0, 2, 3 (d_ff 64) and experts on 1, for tests",
)
_register(
    "olmoe-tiny",
    _moe(**_TINY_MOE, **OLMOE),
    "2-layer OLMoE-style decoder (whole-projection QK-norm), 4 experts, for tests",
)
_register(
    "mixtral-bench",
    _moe(
        **{
            **_TINY_MOE,
            **dict(vocab_size=512, d_model=256, d_ff=512, num_experts=8, max_positions=512),
            "remat": None,
        },
        **MIXTRAL,
    ),
    "2-layer Mixtral-style decoder, d_model 256, 8 experts of width 512, top-2: "
    "`zoo bench --moe-path ragged,dense` on a CPU",
)


def active_param_count(config: GPTConfig) -> int:
    """Parameters one token passes through: every parameter of the model but those of the
    experts it is not routed to (`num_experts - num_experts_per_tok` per routed layer)."""
    shapes = eqx.filter_eval_shape(lambda: GPT(config, key=jax.random.key(0)))
    total = sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes) if hasattr(leaf, "size"))
    settings = config.moe_settings()
    if settings is None:
        return total
    per_expert = 3 * config.d_model * settings.moe_intermediate_size
    idle = settings.num_experts - settings.num_experts_per_tok
    return total - sum(config.routed_layers()) * idle * per_expert
