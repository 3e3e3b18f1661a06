"""A GGUF file -> a HuggingFace config dict and state dict, for zoo's conversion engine.

llama.cpp stores a decoder under its own names (`blk.3.attn_q.weight`, `token_embd.weight`)
with its hyperparameters as metadata (`llama.embedding_length`). This module renames both to
what a HuggingFace checkpoint of the same architecture holds, so that the one key map per
family (`zoo.interop.architectures`) builds the zoo model: `llama` (Llama, SmolLM, Mistral),
`qwen2`, `qwen3`, `phi3` (its fused `attn_qkv` and gate/up `ffn_up` stay fused, as in its
checkpoint; a long-context file's `rope_factors_short/long` tensors are its LongRoPE config),
`gemma2` and `gemma3`. Two more differences are undone: for `llama`, llama.cpp
reorders the rows of each head of the query and key projections (the rotary pairs
`(i, i + head_dim/2)` become adjacent rows); for Gemma, it stores every norm weight plus 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypedDict

import numpy as np

from zoo.interop.gguf.quants import dequantize
from zoo.interop.gguf.reader import GGUFFile
from zoo.interop.gguf.sizes import float_field, int_field, read_sizes

# general.architecture -> (HuggingFace model_type, class)
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}
PERMUTED = {"llama"}  # llama.cpp's converter permutes q/k rows for these (Mistral files too)

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma: a norm before and after attention and feed-forward each (llama.cpp's `ffn_norm` is
# the one before the feed-forward); llama.cpp stores every Gemma norm weight plus 1
GEMMA_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORMS_PLUS_ONE = {"gemma2", "gemma3"}
LAYERS_27B = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales a 27B's scores by d_model/heads
# Phi-3 keeps its fused projections fused: the query/key/value rows in one tensor, and the
# gate and up rows in `ffn_up` (gate first), as in its HuggingFace checkpoint
ARCH_LAYER_NAMES = {
    "phi3": {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_qkv": "self_attn.qkv_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_up": "mlp.gate_up_proj",
        "ffn_down": "mlp.down_proj",
    },
    "gemma2": GEMMA_NAMES,
    "gemma3": GEMMA_NAMES,
}
LAYER_KEY = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Phi-3's LongRoPE factors: rope_scaling field -> the tensor llama.cpp stores it as
LONGROPE_TENSORS = {
    "short_factor": "rope_factors_short.weight",
    "long_factor": "rope_factors_long.weight",
}


class RopeScaling(TypedDict, total=False):
    """A `rope_scaling` of `config.json`: linear (`factor`) or Phi-3's LongRoPE."""

    rope_type: str
    factor: float
    short_factor: list[float]
    long_factor: list[float]
    attention_factor: float


class FamilyFields(TypedDict, total=False):
    """The `config.json` fields of some families only: rope scaling, Phi-3's and Gemma's."""

    rope_scaling: RopeScaling
    partial_rotary_factor: float  # Phi-3
    original_max_position_embeddings: int
    sliding_window: int | None
    hidden_activation: str  # Gemma
    query_pre_attn_scalar: float
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    layer_types: list[str]
    sliding_window_pattern: int
    rope_local_base_freq: float


class GGUFConfig(FamilyFields):
    """The HuggingFace `config.json` a GGUF file's metadata describes (`hf_config`)."""

    model_type: str
    architectures: list[str]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: list[int] | None
    pad_token_id: int | None


def hf_name(gguf: GGUFFile, name: str) -> str:
    """The HuggingFace state-dict key of the llama.cpp tensor `name`."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    arch = architecture(gguf)
    names = ARCH_LAYER_NAMES.get(arch, LAYER_NAMES)
    match = LAYER_KEY.fullmatch(name)
    if match and match.group(2) in names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{names[part]}.{kind}"
    hint = ""
    if name == "rope_freqs.weight":
        hint = " (Llama 3.1+ rope scaling as a frequency table, which zoo does not read)"
    if name.startswith("rope_factors_"):
        hint = " (LongRoPE factors: a phi3 file's rope config, not a weight)"
    raise gguf.error(
        f"the tensor {name}{hint} has no place in a {arch} model zoo builds; "
        f"zoo reads {', '.join(sorted(GLOBAL_NAMES))} and blk.N.{{{', '.join(names)}}}"
    )


def architecture(gguf: GGUFFile) -> str:
    """The file's `general.architecture`, refused unless zoo builds it."""
    name = gguf.text("general.architecture")
    if name not in ARCHITECTURES:
        raise gguf.error(
            f"general.architecture {name!r} is not supported; zoo reads GGUF files of "
            f"{', '.join(ARCHITECTURES)}"
        )
    return name


def _rope(gguf: GGUFFile, arch: str) -> FamilyFields:
    scaling = gguf.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "none":
        return {}
    if scaling == "linear":
        factor = float_field(gguf, arch, "rope.scaling.factor", positive=True)
        return {"rope_scaling": {"rope_type": "linear", "factor": factor}}
    raise gguf.error(
        f"{arch}.rope.scaling.type {scaling!r} is not supported; zoo reads none and linear"
    )


def hf_config(gguf: GGUFFile) -> GGUFConfig:
    """The HuggingFace `config.json` the file's metadata describes."""
    arch = architecture(gguf)
    model_type, hf_class = ARCHITECTURES[arch]
    sizes = read_sizes(gguf, arch)
    vocab, d_model, head_dim, rotary = sizes.vocab, sizes.d_model, sizes.head_dim, sizes.rotary
    if rotary != head_dim and arch != "phi3":
        raise gguf.error(
            f"{arch}.rope.dimension_count {rotary} rotates part of each {head_dim}-wide head; "
            "zoo rotates whole heads of this architecture (partial rotary: phi3)"
        )
    eos = [gguf.integer(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    eos_ids = list(dict.fromkeys(i for i in eos if i is not None))
    return GGUFConfig(
        model_type=model_type,
        architectures=[hf_class],
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=sizes.d_ff,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.kv_heads,
        head_dim=head_dim,
        max_position_embeddings=sizes.context,
        rms_norm_eps=float_field(gguf, arch, "attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=float_field(gguf, arch, "rope.freq_base", 10000.0, positive=True),
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        tie_word_embeddings="output.weight" not in gguf.tensors,
        bos_token_id=gguf.integer("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos_ids or None,
        pad_token_id=gguf.integer("tokenizer.ggml.padding_token_id"),
        **_rope(gguf, arch),
        **_phi3(gguf, arch, rotary / head_dim),
        **longrope(gguf),
        **_gemma(gguf, arch, head_dim, d_model // sizes.heads),
    )


def _gemma(gguf: GGUFFile, arch: str, head_dim: int, width_per_head: int) -> FamilyFields:
    """Gemma's own fields, as llama.cpp reads them: the score scale (1/sqrt(head_dim), a 27B's
    1/sqrt(d_model/heads), or `attention.scale`), soft-caps, the window and its layers; none
    for other architectures."""
    if arch not in NORMS_PLUS_ONE:
        return {}
    scale = gguf.number(f"{arch}.attention.scale")
    layers = int_field(gguf, arch, "block_count")  # checked by `read_sizes`
    scalar = width_per_head if layers == LAYERS_27B[arch] else head_dim
    fields = FamilyFields(
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=scale**-2 if scale is not None and scale > 0 else scalar,
        attn_logit_softcapping=gguf.number(f"{arch}.attn_logit_softcapping"),
        final_logit_softcapping=gguf.number(f"{arch}.final_logit_softcapping"),
        sliding_window=_window(gguf, f"{arch}.attention.sliding_window"),
    )
    pattern = gguf.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer: true for a sliding one
        fields["layer_types"] = ["sliding_attention" if f else "full_attention" for f in pattern]
    elif isinstance(pattern, int):
        fields["sliding_window_pattern"] = pattern
    if arch == "gemma3":
        fields["rope_local_base_freq"] = gguf.number(f"{arch}.rope.freq_base_swa", 10000.0)
    return fields


def _window(gguf: GGUFFile, key: str, default: int | None = None) -> int | None:
    """The positive length (a window, a context) at `key`, or `default` where there is none."""
    value = gguf.integer(key, default) if default is not None else gguf.integer(key)
    if value is not None and value < 1:
        raise gguf.error(f"{key} is {value}; it must be a positive integer")
    return value


def _phi3(gguf: GGUFFile, arch: str, partial_rotary: float) -> FamilyFields:
    """Phi-3's own fields: partial rotary (Phi-4-mini), its window, its original context; none
    for other architectures."""
    if arch != "phi3":
        return {}
    context = int_field(gguf, "phi3", "context_length", 4096)
    window = gguf.integer("phi3.attention.sliding_window")
    return FamilyFields(
        partial_rotary_factor=partial_rotary,
        original_max_position_embeddings=_window(
            gguf, "phi3.rope.scaling.original_context_length", context
        )
        or context,
        sliding_window=window if window is not None and window > 0 else None,
    )


def rope_factor_names(gguf: GGUFFile) -> set[str]:
    """The LongRoPE factor tensors of a long-context Phi-3 file (none in others): config, not
    weights."""
    if architecture(gguf) != "phi3":
        return set()
    return {name for name in gguf.tensors if name in LONGROPE_TENSORS.values()}


def longrope(gguf: GGUFFile) -> FamilyFields:
    """The `rope_scaling` of a Phi-3 file with LongRoPE factor tensors (llama.cpp writes them
    from the checkpoint's `short_factor` and `long_factor`, with the cos/sin scale as
    `phi3.rope.scaling.attn_factor`); {} without them."""
    names = rope_factor_names(gguf)
    if not names:
        return {}
    missing = sorted(set(LONGROPE_TENSORS.values()) - names)
    if missing:
        raise gguf.error(f"it holds {sorted(names)} but not {missing}; LongRoPE needs both")

    def factors(field: str) -> list[float]:
        info = gguf.tensors[LONGROPE_TENSORS[field]]
        values = dequantize(info.data, info.ggml_type, info.shape).astype(np.float32)
        return [float(v) for v in values.reshape(-1)]

    scaling = RopeScaling(
        rope_type="longrope",
        short_factor=factors("short_factor"),
        long_factor=factors("long_factor"),
    )
    attention = gguf.number("phi3.rope.scaling.attn_factor")
    if attention is not None:
        scaling["attention_factor"] = attention
    return {"rope_scaling": scaling}


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query/key row order: within each head, its converter interleaves the
    first and second halves of the rows; the original order takes them back apart."""
    half = rows.shape[0] // heads // 2
    grouped = rows.reshape(heads, half, 2, *rows.shape[1:])
    return grouped.swapaxes(1, 2).reshape(rows.shape)


def hf_state_dict(
    gguf: GGUFFile, config: GGUFConfig, tensors: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """`tensors` (llama.cpp's names) under HuggingFace's names, q/k rows in HF's order."""
    arch = architecture(gguf)
    permuted, plus_one = arch in PERMUTED, arch in NORMS_PLUS_ONE
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out: dict[str, np.ndarray] = {}
    skipped = rope_factor_names(gguf)  # read into the config by `longrope`
    for name, array in tensors.items():
        if name in skipped:
            continue
        match = LAYER_KEY.fullmatch(name)
        if permuted and match and match.group(2) in heads:
            array = unpermute(array, heads[match.group(2)])
        if plus_one and name.endswith("norm.weight"):
            array = array - array.dtype.type(1)
        out[hf_name(gguf, name)] = array
    return out
