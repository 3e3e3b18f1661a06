"""Mixture-of-experts presets: Mixtral, Qwen3-MoE, Qwen2-MoE (Qwen1.5-MoE) and OLMoE.

Each is Llama's parts (`zoo.presets.parts.LLAMA`) with experts in its feed-forward
(`zoo.nn.moe`) and an untied head; the `-tiny` ones are for tests.
"""

from __future__ import annotations

import equinox as eqx
import jax

from zoo.models.gpt import GPT, GPTConfig
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.moe import MoESettings
from zoo.nn.multihead import QKNorm
from zoo.nn.plan import LayerOverride
from zoo.nn.rotary import Rope
from zoo.presets.parts import CPU_REMAT, LLAMA, TINY, Shape, experts, sized, with_parts

MIXTRAL = with_parts(
    LLAMA, {**experts(8, 2, aux_loss_coef=0.02), "attention.rope": Rope(theta=1_000_000.0)}
)
QWEN3_MOE = with_parts(
    LLAMA,
    {
        **experts(128, 8, aux_loss_coef=0.001),
        "attention.qk_norm": QKNorm(eps=1e-6),
        "attention.rope": Rope(theta=1_000_000.0),
        "norm.eps": 1e-6,
    },
)
QWEN2_MOE = with_parts(
    LLAMA,
    {
        **experts(60, 4, normalize_top_k=False, aux_loss_coef=0.001),
        "attention.qkv_bias": True,  # Qwen2: biases on q/k/v only
        "attention.rope": Rope(theta=1_000_000.0),
        "norm.eps": 1e-6,
    },
)
OLMOE = with_parts(
    LLAMA,
    {
        **experts(64, 8, normalize_top_k=False, aux_loss_coef=0.01),
        # RMSNorm over the whole query and key projections
        "attention.qk_norm": QKNorm(scope="projection", eps=1e-5),
    },
)
QWEN_TOKENS: dict[str, object] = dict(bos_id=151643)

# the tiny ones: 2 layers of 4 experts of width 64, top-2, small enough for a test
TINY_MOE = TINY.but(num_kv_heads=2, d_ff=64)
TINY_TOKENS: dict[str, object] = dict(
    bos_id=1, eos_id=2, pad_id=0, remat=CPU_REMAT, **{"feed_forward.num_experts": 4}
)
TINY_TOKENS["feed_forward.top_k"] = 2


def presets() -> dict[str, tuple[GPTConfig, str]]:
    """name -> (config, description) of every mixture-of-experts preset."""
    qwen3_tiny = sized(QWEN3_MOE, TINY_MOE.but(d_ff=32), **TINY_TOKENS)
    dense = FeedForwardSettings(d_ff=64, kind="gated", activation="silu", bias=False)
    return {
        "mixtral-8x7b": (
            sized(
                MIXTRAL,
                Shape(
                    vocab_size=32000,
                    d_model=4096,
                    num_layers=32,
                    num_heads=32,
                    num_kv_heads=8,
                    d_ff=14336,
                    max_positions=32768,
                ),
                bos_id=1,
                eos_id=2,
            ),
            "Mixtral 8x7B shapes: 8 experts of width 14336, top-2 (46.7B, 12.9B active)",
        ),
        "qwen3-30b-a3b": (
            sized(
                QWEN3_MOE,
                Shape(
                    vocab_size=151936,
                    d_model=2048,
                    num_layers=48,
                    num_heads=32,
                    num_kv_heads=4,
                    head_dim=128,
                    d_ff=768,
                    max_positions=40960,
                ),
                eos_id=151645,
                **QWEN_TOKENS,
            ),
            "Qwen3-30B-A3B shapes: 128 experts of width 768, top-8, QK-norm (30.5B, 3.3B active)",
        ),
        "qwen2-moe-a2.7b": (
            sized(
                QWEN2_MOE,
                Shape(
                    vocab_size=151936,
                    d_model=2048,
                    num_layers=24,
                    num_heads=16,
                    d_ff=1408,
                    max_positions=8192,
                ),
                eos_id=151643,
                **QWEN_TOKENS,
                **{"feed_forward.shared_d_ff": 5632},
            ),
            "Qwen1.5-MoE-A2.7B shapes: 60 experts of width 1408, top-4, a gated shared expert "
            "(14.3B)",
        ),
        "olmoe-1b-7b": (
            sized(
                OLMOE,
                Shape(
                    vocab_size=50304,
                    d_model=2048,
                    num_layers=16,
                    num_heads=16,
                    d_ff=1024,
                    max_positions=4096,
                ),
                pad_id=1,
                eos_id=50279,
            ),
            "OLMoE-1B-7B shapes: 64 experts of width 1024, top-8, whole-projection QK-norm (6.9B)",
        ),
        "mixtral-tiny": (
            sized(MIXTRAL, TINY_MOE, **TINY_TOKENS),
            "2-layer Mixtral-style decoder, 4 experts, top-2, for tests",
        ),
        "qwen3-moe-tiny": (
            qwen3_tiny,
            "2-layer Qwen3-MoE-style decoder (QK-norm), 4 experts of width 32, top-2, for tests",
        ),
        "qwen2-moe-tiny": (
            sized(
                QWEN2_MOE,
                TINY_MOE.but(d_ff=32),
                **TINY_TOKENS,
                **{"feed_forward.shared_d_ff": 96},
            ),
            "2-layer Qwen2-MoE-style decoder with a gated shared expert, 4 experts, for tests",
        ),
        "qwen3-moe-mixed-tiny": (
            qwen3_tiny.replace(
                num_layers=4,
                **{
                    "layers.overrides": (
                        LayerOverride(changes={"feed_forward": dense}, layers=(0, 2, 3)),
                    )
                },
            ),
            "4-layer Qwen3-MoE-style decoder, dense layers 0, 2, 3 (d_ff 64) and experts on 1, "
            "for tests",
        ),
        "olmoe-tiny": (
            sized(OLMOE, TINY_MOE, **TINY_TOKENS),
            "2-layer OLMoE-style decoder (whole-projection QK-norm), 4 experts, for tests",
        ),
        "mixtral-bench": (
            sized(
                MIXTRAL,
                TINY_MOE.but(vocab_size=512, d_model=256, d_ff=512, max_positions=512),
                **{**TINY_TOKENS, "remat": None, "feed_forward.num_experts": 8},
            ),
            "2-layer Mixtral-style decoder, d_model 256, 8 experts of width 512, top-2: "
            "`zoo bench --moe-path ragged,dense` on a CPU",
        ),
    }


def active_param_count(config: GPTConfig) -> int:
    """Parameters one token passes through: every parameter of the model but those of the
    experts it is not routed to (`num_experts - top_k` per routed layer)."""
    shapes = eqx.filter_eval_shape(lambda: GPT(config, key=jax.random.key(0)))
    total = sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes) if hasattr(leaf, "size"))
    idle = 0
    for settings in config.layers.layers():
        routed = settings.feed_forward
        if isinstance(routed, MoESettings):
            idle += (routed.num_experts - routed.top_k) * 3 * config.d_model * routed.d_ff
    return total - idle
