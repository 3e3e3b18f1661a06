"""The translator presets: the paper's Transformer and T5, each a family of
`zoo.presets.parts` at a shape."""

from __future__ import annotations

from zoo.models.translator import TranslatorConfig
from zoo.presets.parts import CPU_REMAT, T5, T5_V1_1, TINY, TRANSFORMER, Shape, sized, with_parts


def _t5(vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int) -> Shape:
    return Shape(
        vocab_size=vocab_size,
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        d_ff=d_ff,
        max_positions=512,
    )


def presets() -> dict[str, tuple[TranslatorConfig, str]]:
    """name -> (config, description) of every translator preset."""
    paper = TRANSFORMER.replace(**{"norm.eps": 1e-6})
    flan = with_parts(T5, T5_V1_1)
    return {
        "translator-tiny": (
            sized(
                TRANSFORMER,
                TINY.but(d_ff=256, max_positions=64),
                dropout=0.0,
                attention_dropout=0.0,
                norm_first=True,
            ),
            "2+2-layer translator for tests and the demo",
        ),
        "translator-small": (
            sized(
                TRANSFORMER,
                Shape(
                    vocab_size=8192,
                    d_model=256,
                    num_layers=3,
                    num_heads=4,
                    d_ff=1024,
                    max_positions=64,
                ),
                attention_dropout=0.0,
                remat=CPU_REMAT,
                norm_first=True,
                **{"norm.eps": 1e-6},
            ),
            "3+3-layer pre-LN translator that trains on a CPU (Multi30k)",
        ),
        "transformer-base": (paper, "the paper's base model, shared 37k vocabulary (~63M)"),
        "transformer-big": (
            paper.replace(
                d_model=1024, num_heads=16, d_ff=4096, dropout=0.3, attention_dropout=0.3
            ),
            "the paper's big model, shared 37k vocabulary (~213M)",
        ),
        "t5-small": (
            sized(T5, _t5(32128, 512, 6, 8, 2048)),
            "T5 (v1.0) small shapes: relu, tied and rescaled head (60.5M)",
        ),
        "flan-t5-small": (
            sized(flan, _t5(32128, 512, 8, 6, 1024)),
            "FLAN-T5 small shapes: gated GELU, untied head, 6 heads of 64 (77M)",
        ),
        "flan-t5-base": (
            sized(flan, _t5(32128, 768, 12, 12, 2048)),
            "FLAN-T5 base shapes: gated GELU, untied head (248M)",
        ),
        "mt5-small": (
            sized(flan, _t5(250112, 512, 8, 6, 1024)),
            "mT5 small shapes: FLAN-T5 small with a 250,112-token multilingual vocabulary (300M)",
        ),
    }
