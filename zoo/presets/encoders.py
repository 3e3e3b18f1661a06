"""The classifier presets: BERT, RoBERTa, XLM-R, DistilBERT, ModernBERT, and the tiny ones, each a
family of `zoo.presets.parts` at a shape."""

from __future__ import annotations

from zoo.models.classifier import ClassifierConfig, ClassifierHead
from zoo.nn.embedding import EmbedderSettings
from zoo.presets.parts import (
    BERT,
    CPU_REMAT,
    DISTILBERT,
    MODERNBERT,
    ROBERTA,
    TINY,
    Shape,
    no_dropout,
    sized,
    with_parts,
)

# the CPU classifiers: pre-norm, no embedding norm, token types or pooler, mean pooling
_CPU_CLASSIFIER: dict[str, object] = {
    "norm_first": True,
    "embedder": EmbedderSettings(positions="learned"),
    "head": ClassifierHead(pooling="mean", pooler=None),
    "remat": CPU_REMAT,
}

MODERNBERT_BASE = with_parts(BERT, MODERNBERT)


def _modernbert(num_layers: int, *, d_model: int, num_heads: int, d_ff: int) -> Shape:
    return Shape(
        vocab_size=50368,
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        d_ff=d_ff,
        max_positions=8192,
    )


def presets() -> dict[str, tuple[ClassifierConfig, str]]:
    """name -> (config, description) of every classifier preset."""
    tiny = sized(BERT, TINY, **{**_CPU_CLASSIFIER, "norm.eps": 1e-5})
    small = sized(
        BERT,
        Shape(vocab_size=8192, d_model=128, num_layers=2, num_heads=4, d_ff=256, max_positions=64),
        **_CPU_CLASSIFIER,
    )
    return {
        "classifier-tiny": (no_dropout(tiny), "2-layer encoder classifier for tests and the demo"),
        "classifier-small": (
            small.replace(dropout=0.3, attention_dropout=0.1),
            "2-layer encoder classifier that trains on a CPU (rotten_tomatoes)",
        ),
        "bert-base": (BERT, "BERT-base uncased shapes (110M)"),
        "bert-large": (
            BERT.replace(d_model=1024, num_layers=24, num_heads=16, d_ff=4096),
            "BERT-large uncased shapes (335M)",
        ),
        "roberta-base": (with_parts(BERT, ROBERTA), "RoBERTa-base shapes (125M)"),
        "xlm-roberta-base": (
            with_parts(BERT, {**ROBERTA, "vocab_size": 250002}),
            "XLM-RoBERTa-base shapes (278M, 250k SentencePiece vocabulary)",
        ),
        "distilbert-base": (with_parts(BERT, DISTILBERT), "DistilBERT-base uncased shapes (67M)"),
        "modernbert-tiny": (
            sized(
                MODERNBERT_BASE,
                Shape(
                    vocab_size=64, d_model=32, num_layers=4, num_heads=4, d_ff=48, max_positions=128
                ),
                pad_id=0,
                mask_id=3,
                **{"attention.window": 5},
            ),
            "4-layer ModernBERT-style encoder (local layers see 4 positions either side)",
        ),
        "modernbert-base": (
            sized(MODERNBERT_BASE, _modernbert(22, d_model=768, num_heads=12, d_ff=1152)),
            "ModernBERT-base shapes (149M, 8k context, local and global layers)",
        ),
        "modernbert-large": (
            sized(MODERNBERT_BASE, _modernbert(28, d_model=1024, num_heads=16, d_ff=2624)),
            "ModernBERT-large shapes (395M, 8k context, local and global layers)",
        ),
    }
