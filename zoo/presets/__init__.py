"""Named model configurations: `zoo.create("gpt2", key=...)`.

Tiny presets are for tests and the demo; the others reproduce published shapes.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray

from zoo.models import FLAVORS, ClassifierConfig, GPTConfig, TransformerConfig, TranslatorConfig
from zoo.nn.rotary import Rope
from zoo.presets.families import decoder_families, encoder_families
from zoo.presets.moe import MOE_PRESETS


@dataclass(frozen=True)
class Preset:
    name: str
    flavor: str  # classifier | gpt | translator
    config: TransformerConfig
    description: str


_TINY: dict[str, Any] = dict(dropout=0.0, attention_dropout=0.0, layer_norm_eps=1e-5)
# The CPU presets recompute elementwise work in the backward where that measured faster on a
# CPU (benchmarks/remat.py): GPT and classifier presets, translator-small; not translator-tiny.
_CPU_REMAT: dict[str, Any] = dict(remat="dots")

_PRESETS: dict[str, Preset] = {}


def register(name: str, config: TransformerConfig, description: str) -> Preset:
    """Add a preset (or replace one of the same name)."""
    for flavor, (config_cls, _) in FLAVORS.items():
        if type(config) is config_cls:
            preset = Preset(name, flavor, config, description)
            _PRESETS[name] = preset
            return preset
    raise TypeError(f"not a zoo config: {type(config).__name__}")


def _gpt2(d_model: int, num_layers: int, num_heads: int) -> GPTConfig:
    return GPTConfig(
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        d_ff=4 * d_model,
        bos_id=50256,
        eos_id=50256,
    )


register(
    "gpt-tiny",
    GPTConfig(
        vocab_size=64,
        d_model=64,
        num_heads=4,
        num_layers=2,
        d_ff=256,
        max_positions=128,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        **_TINY,
        **_CPU_REMAT,
    ),
    "2-layer GPT for tests and the demo",
)
register(
    "gpt-small",
    GPTConfig(
        vocab_size=128,
        d_model=128,
        num_heads=4,
        num_layers=4,
        d_ff=512,
        max_positions=128,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        dropout=0.0,
        attention_dropout=0.0,
        **_CPU_REMAT,
    ),
    "4-layer character GPT that trains on a CPU (tiny_shakespeare)",
)
register("gpt2", _gpt2(768, 12, 12), "GPT-2 small shapes (124M)")
register("gpt2-medium", _gpt2(1024, 24, 16), "GPT-2 medium shapes (355M)")
register("gpt2-large", _gpt2(1280, 36, 20), "GPT-2 large shapes (774M)")
register("gpt2-xl", _gpt2(1600, 48, 25), "GPT-2 XL shapes (1.5B)")

# Today's decoders are GPT configurations: the parts that differ from GPT-2, field by field.
LLAMA_PARTS: dict[str, Any] = dict(
    norm="rmsnorm",  # GPT-2: layernorm (mean and variance, with a bias)
    positions="rotary",  # GPT-2: learned (a table added to the embeddings)
    feed_forward="gated",  # GPT-2: dense (two projections)
    activation="silu",  # GPT-2: gelu_tanh; gated + silu is SwiGLU
    use_bias=False,  # GPT-2: biases everywhere
    pad_id=None,  # GPT-2: None too; padding is positional
    dropout=0.0,  # GPT-2: 0.1
    attention_dropout=0.0,  # GPT-2: 0.1
)


def _decoder(**fields: Any) -> GPTConfig:
    """A decoder of Llama's parts. The published sizes recompute the elementwise work in the
    backward on a CPU only (`remat="auto"`: smollm2-135m's train step measured about 1.5x faster
    so, benchmarks/cpu_train_speed.py); the tiny presets name their own `remat`."""
    return GPTConfig(**{**LLAMA_PARTS, "remat": "auto", **fields})


register(
    "llama-tiny",
    _decoder(
        vocab_size=64,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        num_layers=2,
        d_ff=128,
        max_positions=128,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        **_CPU_REMAT,
    ),
    "2-layer Llama-style decoder (RMSNorm, rotary, SwiGLU, 2 kv heads) for tests",
)
register(
    "smollm2-135m",
    _decoder(
        vocab_size=49152,
        d_model=576,
        num_heads=9,
        num_kv_heads=3,
        num_layers=30,
        d_ff=1536,
        max_positions=8192,
        rope=Rope(theta=100000.0),
        bos_id=0,
        eos_id=0,
    ),
    "SmolLM2-135M shapes (Llama architecture, tied head)",
)
register(
    "smollm2-360m",
    _decoder(
        vocab_size=49152,
        d_model=960,
        num_heads=15,
        num_kv_heads=5,
        num_layers=32,
        d_ff=2560,
        max_positions=8192,
        rope=Rope(theta=100000.0),
        bos_id=0,
        eos_id=0,
    ),
    "SmolLM2-360M shapes (Llama architecture, tied head)",
)
register(
    "qwen2.5-0.5b",
    _decoder(
        vocab_size=151936,
        d_model=896,
        num_heads=14,
        num_kv_heads=2,
        num_layers=24,
        d_ff=4864,
        max_positions=32768,
        rope=Rope(theta=1000000.0),
        layer_norm_eps=1e-6,
        qkv_bias=True,  # Qwen2: biases on q/k/v only
        bos_id=151643,
        eos_id=151643,
    ),
    "Qwen2.5-0.5B shapes (q/k/v biases, 7:1 grouped-query attention)",
)
register(
    "qwen3-0.6b",
    _decoder(
        vocab_size=151936,
        d_model=1024,
        num_heads=16,
        num_kv_heads=8,
        attention_head_dim=128,  # 16 heads of 128 > d_model
        num_layers=28,
        d_ff=3072,
        max_positions=40960,
        rope=Rope(theta=1000000.0),
        layer_norm_eps=1e-6,
        qk_norm=True,  # Qwen3: RMSNorm on each head's queries and keys
        bos_id=151643,
        eos_id=151645,
    ),
    "Qwen3-0.6B shapes (QK-norm, head_dim 128)",
)
register(
    "llama-3.2-1b",
    _decoder(
        vocab_size=128256,
        d_model=2048,
        num_heads=32,
        num_kv_heads=8,
        num_layers=16,
        d_ff=8192,
        max_positions=131072,
        rope=Rope(
            theta=500000.0,
            scaling="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_positions=8192,
        ),
        bos_id=128000,
        eos_id=128001,
    ),
    "Llama 3.2 1B shapes (llama3 rotary scaling, tied head)",
)
register(
    "mistral-7b",
    _decoder(
        vocab_size=32000,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        num_layers=32,
        d_ff=14336,
        max_positions=32768,
        sliding_window=4096,  # Mistral 7B v0.1: each position sees the last 4096
        tie_embeddings=False,
        bos_id=1,
        eos_id=2,
    ),
    "Mistral 7B v0.1 shapes (sliding window 4096, untied head)",
)

register(
    "classifier-tiny",
    ClassifierConfig(
        vocab_size=64,
        d_model=64,
        num_heads=4,
        num_layers=2,
        d_ff=128,
        max_positions=128,
        norm_first=True,
        embedding_norm=False,
        pooling="mean",
        pooler=False,
        type_vocab_size=0,
        **_TINY,
        **_CPU_REMAT,
    ),
    "2-layer encoder classifier for tests and the demo",
)
register(
    "classifier-small",
    ClassifierConfig(
        vocab_size=8192,
        d_model=128,
        num_heads=4,
        num_layers=2,
        d_ff=256,
        max_positions=64,
        norm_first=True,
        embedding_norm=False,
        pooling="mean",
        pooler=False,
        type_vocab_size=0,
        dropout=0.3,
        attention_dropout=0.1,
        **_CPU_REMAT,
    ),
    "2-layer encoder classifier that trains on a CPU (rotten_tomatoes)",
)
register("bert-base", ClassifierConfig(), "BERT-base uncased shapes (110M)")
register(
    "bert-large",
    ClassifierConfig(d_model=1024, num_layers=24, num_heads=16, d_ff=4096),
    "BERT-large uncased shapes (335M)",
)

# BERT's relatives, field by field (the rest is bert-base): RoBERTa counts positions from
# pad_id + 1 and has one token type; DistilBERT has 6 layers, no token types and a ReLU head.
ROBERTA_PARTS: dict[str, Any] = dict(
    vocab_size=50265,  # byte-level BPE
    pad_id=1,  # <pad>
    position_offset=2,  # pad_id + 1: positions 2..513 of a 514-row table
    max_positions=514,  # 512 tokens after the offset
    type_vocab_size=1,  # BERT: 2
    layer_norm_eps=1e-5,  # BERT: 1e-12
    activation_dropout=0.0,  # as in transformers: no dropout on the feed-forward hidden
)
register("roberta-base", ClassifierConfig(**ROBERTA_PARTS), "RoBERTa-base shapes (125M)")
register(
    "xlm-roberta-base",
    ClassifierConfig(**{**ROBERTA_PARTS, "vocab_size": 250002}),
    "XLM-RoBERTa-base shapes (278M, 250k SentencePiece vocabulary)",
)
register(
    "distilbert-base",
    ClassifierConfig(
        num_layers=6,
        type_vocab_size=0,  # no segment embeddings
        pooler_activation="relu",  # pre_classifier + ReLU
        classifier_dropout=0.2,  # seq_classif_dropout
        activation_dropout=0.0,
    ),
    "DistilBERT-base uncased shapes (67M)",
)

register(
    "translator-tiny",
    TranslatorConfig(
        vocab_size=64,
        d_model=64,
        num_heads=4,
        num_layers=2,
        d_ff=256,
        max_positions=64,
        norm_first=True,
        **_TINY,
    ),
    "2+2-layer translator for tests and the demo",
)
register(
    "translator-small",
    TranslatorConfig(
        vocab_size=8192,
        d_model=256,
        num_heads=4,
        num_layers=3,
        d_ff=1024,
        max_positions=64,
        norm_first=True,
        dropout=0.1,
        attention_dropout=0.0,
        layer_norm_eps=1e-6,
        **_CPU_REMAT,
    ),
    "3+3-layer pre-LN translator that trains on a CPU (Multi30k)",
)
register(
    "transformer-base",
    TranslatorConfig(layer_norm_eps=1e-6),
    "the paper's base model, shared 37k vocabulary (~63M)",
)
register(
    "transformer-big",
    TranslatorConfig(
        d_model=1024,
        num_heads=16,
        d_ff=4096,
        dropout=0.3,
        attention_dropout=0.3,
        layer_norm_eps=1e-6,
    ),
    "the paper's big model, shared 37k vocabulary (~213M)",
)

# T5 is a translator configuration: the parts that differ from the paper's, field by field.
T5_PARTS: dict[str, Any] = dict(
    vocab_size=32128,  # the paper: 37000 (T5's SentencePiece: 32000 + 100 sentinels, padded)
    norm="rmsnorm",  # the paper: layernorm (T5's LayerNorm has no mean and no bias)
    norm_first=True,  # the paper: post-norm
    use_bias=False,  # the paper: biases everywhere
    positions="relative",  # the paper: sinusoidal (T5: a bucketed bias on the scores)
    scale_scores=False,  # the paper: scores / sqrt(head_dim)
    scale_embeddings=False,  # the paper: embeddings x sqrt(d_model)
    attention_head_dim=64,  # d_kv: heads x 64 need not equal d_model
    max_positions=512,  # relative positions have no limit; T5 trained on 512
    layer_norm_eps=1e-6,
    final_dropout=True,  # dropout after the final norms as well
    pad_id=0,
    bos_id=0,  # decoding starts from the pad id
    eos_id=1,
)
# v1.0: dense relu, head tied to the token table with the output rescaled by d_model^-0.5
T5_V1_0: dict[str, Any] = dict(activation="relu", tie_output=True, scale_output=True)
# v1.1 and FLAN-T5: gated tanh-GELU, an untied head, no rescale
T5_V1_1: dict[str, Any] = dict(
    feed_forward="gated", activation="gelu_tanh", tie_output=False, scale_output=False
)


def _t5(**fields: Any) -> TranslatorConfig:
    return TranslatorConfig(**{**T5_PARTS, **fields})


register(
    "t5-small",
    _t5(d_model=512, num_heads=8, num_layers=6, d_ff=2048, **T5_V1_0),
    "T5 (v1.0) small shapes: relu, tied and rescaled head (60.5M)",
)
register(
    "flan-t5-small",
    _t5(d_model=512, num_heads=6, num_layers=8, d_ff=1024, **T5_V1_1),
    "FLAN-T5 small shapes: gated GELU, untied head, 6 heads of 64 (77M)",
)
register(
    "flan-t5-base",
    _t5(d_model=768, num_heads=12, num_layers=12, d_ff=2048, **T5_V1_1),
    "FLAN-T5 base shapes: gated GELU, untied head (248M)",
)
register(
    "mt5-small",
    _t5(vocab_size=250112, d_model=512, num_heads=6, num_layers=8, d_ff=1024, **T5_V1_1),
    "mT5 small shapes: FLAN-T5 small with a 250,112-token multilingual vocabulary (300M)",
)


def names() -> list[str]:
    """Every preset name, sorted."""
    return sorted(_PRESETS)


def get(name: str) -> Preset:
    """The preset called `name`; an unknown name raises with the closest names."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name, list(_PRESETS), n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown preset {name!r}.{hint} Available: {', '.join(names())}")
    return _PRESETS[name]


def config(name: str, **overrides: Any) -> TransformerConfig:
    """The config of preset `name` with some fields changed."""
    return get(name).config.replace(**overrides)


def create(name: str, *, key: PRNGKeyArray, **overrides: Any) -> eqx.Module:
    """Build the model of preset `name`; keyword overrides change config fields."""
    cfg = config(name, **overrides)
    _, model_cls = FLAVORS[get(name).flavor]
    return model_cls(cfg, key=key)


def build(config: TransformerConfig, *, key: PRNGKeyArray) -> eqx.Module:
    """Build the model that a config describes."""
    for config_cls, model_cls in FLAVORS.values():
        if type(config) is config_cls:
            return model_cls(config, key=key)
    raise TypeError(f"not a zoo config: {type(config).__name__}")


def count_params(model: Any) -> int:
    """Number of parameters: array elements in the model (works on `filter_eval_shape` output)."""
    leaves = jax.tree_util.tree_leaves(model)
    return int(sum(leaf.size for leaf in leaves if hasattr(leaf, "shape")))


def abstract(name: str, **overrides: Any) -> eqx.Module:
    """The model of a preset as shapes only (`jax.ShapeDtypeStruct` leaves): no memory used."""
    return eqx.filter_eval_shape(lambda: create(name, key=jax.random.key(0), **overrides))


def param_count(name: str, **overrides: Any) -> int:
    """Parameter count of a preset, computed without allocating the weights."""
    return count_params(abstract(name, **overrides))


# Gemma 2/3 and OLMo 2, as differences from Llama's parts
for _name, (_config, _description) in decoder_families(LLAMA_PARTS, _CPU_REMAT).items():
    register(_name, _config, _description)

# ModernBERT, as differences from BERT's parts
for _name, (_encoder, _description) in encoder_families().items():
    register(_name, _encoder, _description)

# the mixture-of-experts presets (Mixtral, Qwen-MoE, OLMoE)
for _name, (_config, _description) in MOE_PRESETS.items():
    register(_name, _config, _description)
