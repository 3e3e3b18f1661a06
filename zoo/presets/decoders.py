"""The GPT presets: GPT-2, the Llama family (SmolLM2, Qwen2.5, Qwen3, Llama 3.2, Mistral), Gemma
2 and 3, OLMo 2 and Phi-3/4, each a family of `zoo.presets.parts` at a shape (SmolLM3 and OLMo 3
in `zoo.presets.layer_kinds`)."""

from __future__ import annotations

from zoo.models.gpt import GPTConfig, LMHead
from zoo.nn.rotary import Rope
from zoo.presets.longrope import (
    PHI4_LONG_FACTOR,
    PHI4_SHORT_FACTOR,
    PHI35_LONG_FACTOR,
    PHI35_SHORT_FACTOR,
)
from zoo.presets.parts import (
    CPU_REMAT,
    GEMMA2,
    GEMMA3,
    GPT2,
    LLAMA,
    OLMO2,
    PHI3,
    QWEN2,
    QWEN3,
    TINY,
    Shape,
    no_dropout,
    sized,
    with_parts,
)


def _gpt2(d_model: int, num_layers: int, num_heads: int) -> GPTConfig:
    shape = Shape(
        vocab_size=50257,
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        d_ff=4 * d_model,
        max_positions=1024,
    )
    return sized(GPT2, shape)


def _smollm2(**sizes: int) -> GPTConfig:
    """SmolLM2: Llama's parts, a 49k vocabulary, 8k positions, rotary base 100000."""
    shape = Shape(vocab_size=49152, max_positions=8192, **sizes)
    return sized(LLAMA, shape, bos_id=0, eos_id=0, **{"attention.rope": Rope(theta=100000.0)})


def _phi_longrope(short: tuple[float, ...], long: tuple[float, ...], **fields: float) -> Rope:
    """LongRoPE past 4096 positions to 131072 (factor 32), from the hub's factors."""
    return Rope(
        scaling="longrope",
        short_factor=short,
        long_factor=long,
        original_max_positions=4096,
        factor=32.0,  # 131072 / 4096
        **fields,  # type: ignore[arg-type]
    )


PHI3_MINI = Shape(
    vocab_size=32064, d_model=3072, num_layers=32, num_heads=32, d_ff=8192, max_positions=4096
)
PHI3_MINI_TOKENS: dict[str, object] = dict(bos_id=1, eos_id=32000, stop_ids=(32001, 32007))

GEMMA2_BASE, GEMMA3_BASE = with_parts(LLAMA, GEMMA2), with_parts(LLAMA, GEMMA3)
QWEN_ROPE = Rope(theta=1_000_000.0)


def presets() -> dict[str, tuple[GPTConfig, str]]:
    """name -> (config, description) of every GPT preset here but the experts'."""
    tiny = no_dropout(sized(GPT2, TINY.but(d_ff=256), pad_id=0, bos_id=1, eos_id=2))
    llama_tiny = sized(LLAMA, TINY.but(num_kv_heads=2), pad_id=0, bos_id=1, eos_id=2)
    return {
        "gpt-tiny": (tiny.replace(remat=CPU_REMAT), "2-layer GPT for tests and the demo"),
        "gpt-small": (
            no_dropout(
                sized(
                    GPT2,
                    Shape(
                        vocab_size=128,
                        d_model=128,
                        num_layers=4,
                        num_heads=4,
                        d_ff=512,
                        max_positions=128,
                    ),
                    pad_id=0,
                    bos_id=1,
                    eos_id=2,
                    remat=CPU_REMAT,
                )
            ),
            "4-layer character GPT that trains on a CPU (tiny_shakespeare)",
        ),
        "gpt2": (_gpt2(768, 12, 12), "GPT-2 small shapes (124M)"),
        "gpt2-medium": (_gpt2(1024, 24, 16), "GPT-2 medium shapes (355M)"),
        "gpt2-large": (_gpt2(1280, 36, 20), "GPT-2 large shapes (774M)"),
        "gpt2-xl": (_gpt2(1600, 48, 25), "GPT-2 XL shapes (1.5B)"),
        "llama-tiny": (
            llama_tiny.replace(remat=CPU_REMAT),
            "2-layer Llama-style decoder (RMSNorm, rotary, SwiGLU, 2 kv heads) for tests",
        ),
        "smollm2-135m": (
            _smollm2(d_model=576, num_layers=30, num_heads=9, num_kv_heads=3, d_ff=1536),
            "SmolLM2-135M shapes (Llama architecture, tied head)",
        ),
        "smollm2-360m": (
            _smollm2(d_model=960, num_layers=32, num_heads=15, num_kv_heads=5, d_ff=2560),
            "SmolLM2-360M shapes (Llama architecture, tied head)",
        ),
        "qwen2.5-0.5b": (
            sized(
                with_parts(LLAMA, QWEN2),
                Shape(
                    vocab_size=151936,
                    d_model=896,
                    num_layers=24,
                    num_heads=14,
                    num_kv_heads=2,
                    d_ff=4864,
                    max_positions=32768,
                ),
                bos_id=151643,
                eos_id=151643,
                **{"attention.rope": QWEN_ROPE},
            ),
            "Qwen2.5-0.5B shapes (q/k/v biases, 7:1 grouped-query attention)",
        ),
        "qwen3-0.6b": (
            sized(
                with_parts(LLAMA, QWEN3),
                Shape(
                    vocab_size=151936,
                    d_model=1024,
                    num_layers=28,
                    num_heads=16,
                    num_kv_heads=8,
                    head_dim=128,  # 16 heads of 128 > d_model
                    d_ff=3072,
                    max_positions=40960,
                ),
                bos_id=151643,
                eos_id=151645,
                **{"attention.rope": QWEN_ROPE},
            ),
            "Qwen3-0.6B shapes (QK-norm, head_dim 128)",
        ),
        "llama-3.2-1b": (
            sized(
                LLAMA,
                Shape(
                    vocab_size=128256,
                    d_model=2048,
                    num_layers=16,
                    num_heads=32,
                    num_kv_heads=8,
                    d_ff=8192,
                    max_positions=131072,
                ),
                bos_id=128000,
                eos_id=128001,
                **{
                    "attention.rope": Rope(
                        theta=500000.0,
                        scaling="llama3",
                        factor=32.0,
                        low_freq_factor=1.0,
                        high_freq_factor=4.0,
                        original_max_positions=8192,
                    )
                },
            ),
            "Llama 3.2 1B shapes (llama3 rotary scaling, tied head)",
        ),
        "mistral-7b": (
            sized(
                LLAMA,
                Shape(
                    vocab_size=32000,
                    d_model=4096,
                    num_layers=32,
                    num_heads=32,
                    num_kv_heads=8,
                    d_ff=14336,
                    max_positions=32768,
                ),
                head=LMHead(tie=False),
                bos_id=1,
                eos_id=2,
                **{"attention.window": 4096},  # Mistral 7B v0.1: each sees the last 4096
            ),
            "Mistral 7B v0.1 shapes (sliding window 4096, untied head)",
        ),
        **_gemma(),
        **_olmo2(llama_tiny),
        **_phi(),
    }


def _gemma() -> dict[str, tuple[GPTConfig, str]]:
    tiny = TINY.but(num_kv_heads=2, head_dim=16)
    tiny_parts = {"attention.window": 8, "attention.scale_dim": 16.0, "remat": CPU_REMAT}
    return {
        "gemma-2-tiny": (
            sized(GEMMA2_BASE, tiny.but(num_layers=3), **tiny_parts),
            "3-layer Gemma 2-style decoder (sandwich norms, soft-capping, local/global) for tests",
        ),
        "gemma-2-2b": (
            sized(
                GEMMA2_BASE,
                Shape(
                    vocab_size=256000,
                    d_model=2304,
                    num_layers=26,
                    num_heads=8,
                    num_kv_heads=4,
                    d_ff=9216,
                    max_positions=8192,
                ),
            ),
            "Gemma 2 2B shapes (soft-capping, alternating 4096-window and full layers)",
        ),
        "gemma-3-tiny": (
            sized(GEMMA3_BASE, tiny.but(num_layers=7, num_kv_heads=1), **tiny_parts),
            "7-layer Gemma 3-style decoder (QK-norm, 5 local : 1 global, two rotary bases) for "
            "tests",
        ),
        "gemma-3-270m": (
            sized(GEMMA3_BASE, _gemma3(18, d_model=640, d_ff=2048)),
            "Gemma 3 270M shapes (262k vocabulary, 5 local : 1 global)",
        ),
        "gemma-3-1b": (
            sized(GEMMA3_BASE, _gemma3(26, d_model=1152, d_ff=6912)),
            "Gemma 3 1B shapes (QK-norm, 512-window local layers, 1M-base global ones)",
        ),
    }


def _gemma3(num_layers: int, *, d_model: int, d_ff: int) -> Shape:
    return Shape(
        vocab_size=262144,
        d_model=d_model,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=1,
        d_ff=d_ff,
        max_positions=32768,
    )


def _olmo2(llama_tiny: GPTConfig) -> dict[str, tuple[GPTConfig, str]]:
    tiny = with_parts(llama_tiny, OLMO2).replace(**{"attention.num_kv_heads": None})
    return {
        "olmo-2-tiny": (
            tiny.replace(remat=CPU_REMAT),
            "2-layer OLMo 2-style decoder (norms after each sub-layer, whole-projection QK-norm)",
        ),
        "olmo-2-1b": (
            sized(
                with_parts(LLAMA, OLMO2),
                Shape(
                    vocab_size=100352,
                    d_model=2048,
                    num_layers=16,
                    num_heads=16,
                    d_ff=8192,
                    max_positions=4096,
                ),
                pad_id=100277,
                eos_id=100257,
                **{
                    "attention.rope": Rope(theta=500000.0),
                    "norm.eps": 1e-6,
                    "attention.qk_norm.eps": 1e-6,
                },
            ),
            "OLMo 2 1B (0425) shapes (untied head, 100k vocabulary)",
        ),
    }


def _phi() -> dict[str, tuple[GPTConfig, str]]:
    phi3 = with_parts(LLAMA, PHI3)
    tiny_rope = Rope(
        scaling="longrope",
        short_factor=(1.0, 1.2, 1.5, 2.0, 2.0, 3.0),
        long_factor=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
        original_max_positions=32,
        factor=4.0,
        partial_rotary_factor=0.75,
    )
    phi35_rope = _phi_longrope(PHI35_SHORT_FACTOR, PHI35_LONG_FACTOR)
    phi4_rope = _phi_longrope(PHI4_SHORT_FACTOR, PHI4_LONG_FACTOR, partial_rotary_factor=0.75)
    phi4 = Shape(
        vocab_size=200064,
        d_model=3072,
        num_layers=32,
        num_heads=24,
        num_kv_heads=8,
        d_ff=8192,
        max_positions=131072,
    )
    return {
        "phi-3-tiny": (
            sized(
                phi3,
                TINY.but(num_kv_heads=2),
                bos_id=1,
                eos_id=2,
                remat=CPU_REMAT,
                **{"attention.rope": tiny_rope},
            ),
            "2-layer Phi-style decoder (LongRoPE past 32 positions, 3/4 of each head rotated)",
        ),
        "phi-3-mini-4k": (
            sized(phi3, PHI3_MINI, **PHI3_MINI_TOKENS, **{"attention.window": 2047}),
            "Phi-3-mini-4k shapes (3.8B, 2047-token window, 32k vocabulary)",
        ),
        "phi-3.5-mini": (
            sized(
                phi3,
                PHI3_MINI.but(max_positions=131072),
                **PHI3_MINI_TOKENS,
                **{"attention.rope": phi35_rope},
            ),
            "Phi-3.5-mini shapes (3.8B, 128k context by LongRoPE past 4k, 32k vocabulary)",
        ),
        "phi-4-mini": (
            sized(
                phi3,
                phi4,
                head=LMHead(tie=True),
                bos_id=199999,
                eos_id=199999,
                stop_ids=(200020,),  # <|end|>
                **{"attention.rope": phi4_rope},
            ),
            "Phi-4-mini shapes (3.8B, 200k vocabulary, partial rotary, 128k context by LongRoPE)",
        ),
    }
