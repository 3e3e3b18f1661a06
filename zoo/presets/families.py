"""Gemma 2/3, OLMo 2 and Phi-3/4 presets, each family as its differences from Llama's parts.

`zoo.presets` registers what `decoder_families` returns; the `-tiny` ones are for tests.
"""

from __future__ import annotations

from typing import Any

from zoo.models import ClassifierConfig, GPTConfig
from zoo.nn.rotary import Rope

# Gemma 2 and 3: Llama's parts with these changed (zoo.interop.architectures.gemma)
GEMMA_PARTS: dict[str, Any] = dict(
    activation="gelu_tanh",  # Llama: silu (gated + tanh GELU is GeGLU)
    output_norm=True,  # Llama: a norm before each sub-layer only (Gemma: before and after)
    norm_weight_offset=1.0,  # Llama: weight (Gemma: 1 + weight)
    scale_embeddings=True,  # Llama: embeddings as they are (Gemma: times sqrt(d_model))
    layer_norm_eps=1e-6,
    query_pre_attn_scalar=256.0,  # Llama: scores / sqrt(head_dim)
    attention_head_dim=256,
    pad_id=0,
    bos_id=2,
    eos_id=1,
)
# Gemma 2 differs from Gemma 3 in these
GEMMA2_PARTS: dict[str, Any] = dict(
    attention_softcap=50.0,  # Gemma 3: none (QK-norm instead)
    final_logit_softcap=30.0,  # Gemma 3: none
)
GEMMA3_PARTS: dict[str, Any] = dict(
    qk_norm=True,  # Gemma 2: none
    rope=Rope(theta=1_000_000.0),  # Gemma 2: 10000 everywhere
    local_rope_theta=10_000.0,  # the sliding layers' base
    vocab_size=262144,
    sliding_window=512,  # Gemma 2: 4096
    max_positions=32768,
)


# OLMo 2: Llama's parts with the norms moved onto the sub-layer outputs
OLMO2_PARTS: dict[str, Any] = dict(
    norm_first=False,  # Llama: a norm before each sub-layer
    output_norm=True,  # OLMo 2: x + norm(f(x)) instead
    qk_norm=True,  # Llama: none
    qk_norm_scope="projection",  # over all heads at once (Qwen3: per head)
    tie_embeddings=False,
)

# Phi-3 / Phi-3.5 / Phi-4-mini: Llama's parts (the checkpoint fuses q/k/v and gate/up)
PHI3_PARTS: dict[str, Any] = dict(
    layer_norm_eps=1e-5,
    tie_embeddings=False,
    pad_id=None,  # the hub's pad id is the end-of-text id
)
PHI3_MINI: dict[str, Any] = dict(
    PHI3_PARTS,
    vocab_size=32064,
    d_model=3072,
    num_heads=32,
    num_layers=32,
    d_ff=8192,
    max_positions=4096,
    bos_id=1,
    eos_id=32000,
    stop_ids=(32001, 32007),  # <|assistant|>, <|end|>
)


def _factors(text: str) -> tuple[float, ...]:
    return tuple(float(value) for value in text.split())


# LongRoPE's per-frequency divisors from the hub's config.json `rope_scaling` (48 each: the
# rotating dimensions / 2); short within the original 4096 positions, long beyond them
PHI35_SHORT_FACTOR = _factors(
    """
    1.0 1.0199999809265137 1.0299999713897705 1.0299999713897705 1.0499999523162842
    1.0499999523162842 1.0499999523162842 1.0499999523162842 1.0499999523162842 1.0699999332427979
    1.0999999046325684 1.1099998950958252 1.1599998474121094 1.1599998474121094 1.1699998378753662
    1.2899998426437378 1.339999794960022 1.679999828338623 1.7899998426437378 1.8199998140335083
    1.8499997854232788 1.8799997568130493 1.9099997282028198 1.9399996995925903 1.9899996519088745
    2.0199997425079346 2.0199997425079346 2.0199997425079346 2.0199997425079346 2.0199997425079346
    2.0199997425079346 2.0299997329711914 2.0299997329711914 2.0299997329711914 2.0299997329711914
    2.0299997329711914 2.0299997329711914 2.0299997329711914 2.0299997329711914 2.0299997329711914
    2.0799996852874756 2.0899996757507324 2.189999580383301 2.2199995517730713 2.5899994373321533
    2.729999542236328 2.749999523162842 2.8399994373321533
    """
)
PHI35_LONG_FACTOR = _factors(
    """
    1.0800000429153442 1.1100000143051147 1.1399999856948853 1.340000033378601 1.5899999141693115
    1.600000023841858 1.6200000047683716 2.620000123977661 3.2300000190734863 3.2300000190734863
    4.789999961853027 7.400000095367432 7.700000286102295 9.09000015258789 12.199999809265137
    17.670000076293945 24.46000099182129 28.57000160217285 30.420001983642578 30.840002059936523
    32.590003967285156 32.93000411987305 42.320003509521484 44.96000289916992 50.340003967285156
    50.45000457763672 57.55000305175781 57.93000411987305 58.21000289916992 60.1400032043457
    62.61000442504883 62.62000274658203 62.71000289916992 63.1400032043457 63.1400032043457
    63.77000427246094 63.93000411987305 63.96000289916992 63.970001220703125 64.02999877929688
    64.06999969482422 64.08000183105469 64.12000274658203 64.41000366210938 64.4800033569336
    64.51000213623047 64.52999877929688 64.83999633789062
    """
)
PHI4_SHORT_FACTOR = (1.0,) * 48
PHI4_LONG_FACTOR = _factors(
    """
    1.0 1.118320672 1.250641126 1.398617824 1.564103225 1.74916897 1.956131817 2.187582649
    2.446418898 2.735880826 3.059592084 3.421605075 3.826451687 4.279200023 4.785517845 5.351743533
    5.984965424 6.693110555 7.485043894 8.370679318 9.36110372 10.4687158 11.70738129 13.09260651
    14.64173252 16.37415215 18.31155283 20.47818807 22.90118105 25.61086418 28.64115884 32.03
    32.1 32.13 32.23 32.6 32.61 32.64 32.66 32.7
    32.71 32.93 32.97 33.28 33.49 33.5 44.16 47.77
    """
)


def decoder_families(
    llama_parts: dict[str, Any], cpu_remat: dict[str, Any]
) -> dict[str, tuple[GPTConfig, str]]:
    """name -> (config, description) of every preset here, built on `llama_parts`
    (`zoo.presets.LLAMA_PARTS`); the tiny ones take `cpu_remat` as the other tiny presets do."""
    presets: dict[str, tuple[GPTConfig, str]] = {}

    def add(name: str, config: GPTConfig, description: str) -> None:
        presets[name] = (config, description)

    def decoder(**fields: Any) -> GPTConfig:
        return GPTConfig(**{**llama_parts, **fields})

    def _gemma2(num_layers: int, **fields: Any) -> GPTConfig:
        """Gemma 2: sliding and full layers alternate, sliding first."""
        full = tuple(range(1, num_layers, 2))
        parts = {**GEMMA_PARTS, **GEMMA2_PARTS, "global_layers": full, "num_layers": num_layers}
        return decoder(**{**parts, **fields})

    def _gemma3(num_layers: int, **fields: Any) -> GPTConfig:
        """Gemma 3: five sliding layers, then a full one."""
        full = tuple(range(5, num_layers, 6))
        return decoder(
            **{
                **GEMMA_PARTS,
                **GEMMA3_PARTS,
                "global_layers": full,
                "num_layers": num_layers,
                **fields,
            }
        )

    add(
        "gemma-2-tiny",
        _gemma2(
            3,
            vocab_size=64,
            d_model=64,
            num_heads=4,
            num_kv_heads=2,
            attention_head_dim=16,
            d_ff=128,
            max_positions=128,
            sliding_window=8,
            query_pre_attn_scalar=16.0,
            **cpu_remat,
        ),
        "3-layer Gemma 2-style decoder (sandwich norms, soft-capping, local/global) for tests",
    )
    add(
        "gemma-2-2b",
        _gemma2(
            26,
            vocab_size=256000,
            d_model=2304,
            num_heads=8,
            num_kv_heads=4,
            d_ff=9216,
            max_positions=8192,
            sliding_window=4096,
        ),
        "Gemma 2 2B shapes (soft-capping, alternating 4096-window and full layers)",
    )
    add(
        "gemma-3-tiny",
        _gemma3(
            7,
            vocab_size=64,
            d_model=64,
            num_heads=4,
            num_kv_heads=1,
            attention_head_dim=16,
            d_ff=128,
            max_positions=128,
            sliding_window=8,
            query_pre_attn_scalar=16.0,
            **cpu_remat,
        ),
        "7-layer Gemma 3-style decoder (QK-norm, 5 local : 1 global, two rotary bases) for tests",
    )
    add(
        "gemma-3-270m",
        _gemma3(18, d_model=640, num_heads=4, num_kv_heads=1, d_ff=2048),
        "Gemma 3 270M shapes (262k vocabulary, 5 local : 1 global)",
    )
    add(
        "gemma-3-1b",
        _gemma3(26, d_model=1152, num_heads=4, num_kv_heads=1, d_ff=6912),
        "Gemma 3 1B shapes (QK-norm, 512-window local layers, 1M-base global ones)",
    )

    add(
        "olmo-2-tiny",
        decoder(
            **OLMO2_PARTS,
            vocab_size=64,
            d_model=64,
            num_heads=4,
            num_layers=2,
            d_ff=128,
            max_positions=128,
            pad_id=0,
            bos_id=1,
            eos_id=2,
            **cpu_remat,
        ),
        "2-layer OLMo 2-style decoder (norms after each sub-layer, whole-projection QK-norm)",
    )
    add(
        "olmo-2-1b",
        decoder(
            **OLMO2_PARTS,
            vocab_size=100352,
            d_model=2048,
            num_heads=16,
            num_layers=16,
            d_ff=8192,
            max_positions=4096,
            rope=Rope(theta=500000.0),
            layer_norm_eps=1e-6,
            pad_id=100277,
            eos_id=100257,
        ),
        "OLMo 2 1B (0425) shapes (untied head, 100k vocabulary)",
    )

    add(
        "phi-3-tiny",
        decoder(
            **PHI3_PARTS,
            vocab_size=64,
            d_model=64,
            num_heads=4,
            num_kv_heads=2,
            num_layers=2,
            d_ff=128,
            max_positions=128,
            bos_id=1,
            eos_id=2,
            rope=Rope(
                scaling="longrope",
                short_factor=(1.0, 1.2, 1.5, 2.0, 2.0, 3.0),
                long_factor=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
                original_max_positions=32,
                factor=4.0,
                partial_rotary_factor=0.75,
            ),
            **cpu_remat,
        ),
        "2-layer Phi-style decoder (LongRoPE past 32 positions, 3/4 of each head rotated)",
    )
    add(
        "phi-3-mini-4k",
        decoder(**PHI3_MINI, sliding_window=2047),
        "Phi-3-mini-4k shapes (3.8B, 2047-token window, 32k vocabulary)",
    )
    add(
        "phi-3.5-mini",
        decoder(
            **{**PHI3_MINI, "max_positions": 131072},
            rope=Rope(
                scaling="longrope",
                short_factor=PHI35_SHORT_FACTOR,
                long_factor=PHI35_LONG_FACTOR,
                original_max_positions=4096,
                factor=32.0,  # 131072 / 4096
            ),
        ),
        "Phi-3.5-mini shapes (3.8B, 128k context by LongRoPE past 4k, 32k vocabulary)",
    )
    add(
        "phi-4-mini",
        decoder(
            **{**PHI3_PARTS, "tie_embeddings": True},
            vocab_size=200064,
            d_model=3072,
            num_heads=24,
            num_kv_heads=8,
            num_layers=32,
            d_ff=8192,
            max_positions=131072,
            rope=Rope(
                scaling="longrope",
                short_factor=PHI4_SHORT_FACTOR,
                long_factor=PHI4_LONG_FACTOR,
                original_max_positions=4096,
                factor=32.0,  # 131072 / 4096
                partial_rotary_factor=0.75,  # 96 of each head's 128 dimensions
            ),
            bos_id=199999,
            eos_id=199999,
            stop_ids=(200020,),  # <|end|>
        ),
        "Phi-4-mini shapes (3.8B, 200k vocabulary, partial rotary, 128k context by LongRoPE)",
    )
    return presets


# ModernBERT: BERT's classifier with these parts changed (zoo.interop.architectures.modernbert)
MODERNBERT_PARTS: dict[str, Any] = dict(
    norm_first=True,  # BERT: post-norm (ModernBERT: pre-norm and a final norm)
    first_attention_norm=False,  # layer 0's attention reads the normed embeddings directly
    norm_bias=False,  # BERT: LayerNorms with bias
    layer_norm_eps=1e-5,  # BERT: 1e-12
    use_bias=False,  # BERT: biases on every projection
    positions="rotary",  # BERT: learned positions
    rope=Rope(theta=160_000.0),  # the global layers' base
    local_rope_theta=10_000.0,  # the local layers' base
    sliding_window=65,  # local layers see 64 positions either side (local_attention=128)
    feed_forward="gated",  # GeGLU (BERT: a dense GELU)
    type_vocab_size=0,  # BERT: two segments
    pooler_activation="gelu",  # BERT: tanh
    pooler_bias=False,
    pooler_norm=True,  # the head is dense -> GELU -> norm
    dropout=0.0,
    attention_dropout=0.0,
    classifier_dropout=0.0,
    vocab_size=50368,
    pad_id=50283,
    mask_id=50284,
    max_positions=8192,
)


def encoder_families() -> dict[str, tuple[ClassifierConfig, str]]:
    """name -> (config, description) of the encoder presets here (ModernBERT)."""

    def modernbert(num_layers: int, **fields: Any) -> ClassifierConfig:
        """A global layer every third, the first one included; the rest local."""
        full = tuple(range(0, num_layers, 3))
        return ClassifierConfig(
            **{**MODERNBERT_PARTS, "num_layers": num_layers, "global_layers": full, **fields}
        )

    return {
        "modernbert-tiny": (
            modernbert(
                4,
                vocab_size=64,
                d_model=32,
                num_heads=4,
                d_ff=48,
                max_positions=128,
                sliding_window=5,
                pad_id=0,
                mask_id=3,
            ),
            "4-layer ModernBERT-style encoder (local layers see 4 positions either side)",
        ),
        "modernbert-base": (
            modernbert(22, d_model=768, num_heads=12, d_ff=1152),
            "ModernBERT-base shapes (149M, 8k context, local and global layers)",
        ),
        "modernbert-large": (
            modernbert(28, d_model=1024, num_heads=16, d_ff=2624),
            "ModernBERT-large shapes (395M, 8k context, local and global layers)",
        ),
    }
