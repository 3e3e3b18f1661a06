"""The GPT presets whose layers differ by kind beyond Gemma's: SmolLM3 (no rotary positions on
every fourth layer) and OLMo 3 (three sliding-window layers to one full one, each kind with its
own rotary settings), each a family of `zoo.presets.parts` at a shape."""

from __future__ import annotations

from zoo.models.gpt import GPTConfig
from zoo.nn.plan import LayerOverride
from zoo.nn.rotary import Rope
from zoo.presets.parts import CPU_REMAT, LLAMA, OLMO3, SMOLLM3, TINY, Shape, sized, with_parts


def presets() -> dict[str, tuple[GPTConfig, str]]:
    """name -> (config, description) of the SmolLM3 and OLMo 3 presets."""
    llama_tiny = sized(LLAMA, TINY.but(num_kv_heads=2), pad_id=0, bos_id=1, eos_id=2)
    return {**_olmo3(llama_tiny), **_smollm3(llama_tiny)}


def _olmo3_full_layers(rope: Rope) -> dict[str, object]:
    """OLMo 3's full layers (every fourth): no window, and their own rotary `rope`."""
    full = {"attention.window": None, "attention.rope": rope}
    return {"layers.overrides": (LayerOverride(changes=full, start=3, step=4),)}


def _olmo3(llama_tiny: GPTConfig) -> dict[str, tuple[GPTConfig, str]]:
    tiny_yarn = Rope(scaling="yarn", factor=4.0, original_max_positions=32)
    tiny = with_parts(llama_tiny, OLMO3).replace(
        num_layers=4,
        remat=CPU_REMAT,
        **{"attention.num_kv_heads": None, "attention.window": 8, **_olmo3_full_layers(tiny_yarn)},
    )
    # the full layers' YaRN from 8192 positions to 65536, as in allenai/Olmo-3-1025-7B
    yarn = Rope(
        theta=500000.0,
        scaling="yarn",
        factor=8.0,
        original_max_positions=8192,
        attention_factor=1.2079441541679836,
    )
    olmo3_7b = Shape(
        vocab_size=100278,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        d_ff=11008,
        max_positions=65536,
    )
    return {
        "olmo3-tiny": (
            tiny,
            "4-layer OLMo 3-style decoder (OLMo 2's parts, 3 sliding-window : 1 full layer, "
            "YaRN on the full ones) for tests",
        ),
        "olmo3-7b": (
            sized(
                with_parts(LLAMA, OLMO3),
                olmo3_7b,
                pad_id=100277,
                eos_id=100257,
                **{
                    "attention.rope": Rope(theta=500000.0),
                    "norm.eps": 1e-6,
                    "attention.qk_norm.eps": 1e-6,
                    **_olmo3_full_layers(yarn),
                },
            ),
            "OLMo 3 7B shapes (4096-token windows on 3 layers of 4, YaRN to 65k on the others)",
        ),
    }


def _smollm3(llama_tiny: GPTConfig) -> dict[str, tuple[GPTConfig, str]]:
    tiny = with_parts(llama_tiny, SMOLLM3).replace(
        num_layers=4, remat=CPU_REMAT, **{"attention.rope": Rope(theta=10000.0)}
    )
    smollm3_3b = Shape(
        vocab_size=128256,
        d_model=2048,
        num_layers=36,
        num_heads=16,
        num_kv_heads=4,
        d_ff=11008,
        max_positions=65536,
    )
    return {
        "smollm3-tiny": (
            tiny,
            "4-layer SmolLM3-style decoder (Llama's parts, no rotary on every fourth layer) "
            "for tests",
        ),
        "smollm3-3b": (
            sized(
                with_parts(LLAMA, SMOLLM3),
                smollm3_3b,
                bos_id=None,
                eos_id=128012,
                pad_id=128004,
                **{"norm.eps": 1e-6},
            ),
            "SmolLM3-3B shapes (NoPE every fourth layer, rotary base 5M, tied head)",
        ),
    }
