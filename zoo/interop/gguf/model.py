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
from typing import Any

import numpy as np

from zoo.interop.gguf.quants import dequantize
from zoo.interop.gguf.reader import GGUFFile

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
    name = gguf.get("general.architecture")
    if name not in ARCHITECTURES:
        raise gguf.error(
            f"general.architecture {name!r} is not supported; zoo reads GGUF files of "
            f"{', '.join(ARCHITECTURES)}"
        )
    return str(name)


def _field(gguf: GGUFFile, arch: str, key: str, default: Any = None) -> Any:
    value = gguf.get(f"{arch}.{key}", default)
    if value is None:
        raise gguf.error(f"the metadata lacks {arch}.{key}, which a {arch} model needs")
    if isinstance(value, list):  # a per-layer list: zoo gives every layer the same
        if len(set(value)) != 1:
            raise gguf.error(f"{arch}.{key} differs between layers ({value}); zoo needs one value")
        value = value[0]
    return value


def _rope(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    scaling = gguf.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "none":
        return {}
    if scaling == "linear":
        return {
            "rope_scaling": {
                "rope_type": "linear",
                "factor": _field(gguf, arch, "rope.scaling.factor"),
            }
        }
    raise gguf.error(
        f"{arch}.rope.scaling.type {scaling!r} is not supported; zoo reads none and linear"
    )


def hf_config(gguf: GGUFFile) -> dict[str, Any]:
    """The HuggingFace `config.json` the file's metadata describes."""
    arch = architecture(gguf)
    model_type, hf_class = ARCHITECTURES[arch]
    if "token_embd.weight" not in gguf.tensors:
        raise gguf.error("it holds no token_embd.weight, the embedding every model has")
    vocab, d_model = gguf.tensors["token_embd.weight"].shape
    heads = int(_field(gguf, arch, "attention.head_count"))
    head_dim = int(_field(gguf, arch, "attention.key_length", d_model // heads))
    rotary = gguf.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim and arch != "phi3":
        raise gguf.error(
            f"{arch}.rope.dimension_count {rotary} rotates part of each {head_dim}-wide head; "
            "zoo rotates whole heads of this architecture (partial rotary: phi3)"
        )
    eos = [gguf.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    eos_ids = list(dict.fromkeys(i for i in eos if isinstance(i, int)))
    return {
        "model_type": model_type,
        "architectures": [hf_class],
        "vocab_size": vocab,
        "hidden_size": d_model,
        "intermediate_size": int(_field(gguf, arch, "feed_forward_length")),
        "num_hidden_layers": int(_field(gguf, arch, "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(gguf, arch, "attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(gguf, arch, "context_length", 2048)),
        "rms_norm_eps": float(_field(gguf, arch, "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(gguf, arch, "rope.freq_base", 10000.0)),
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos_ids or None,
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id"),
        **_rope(gguf, arch),
        **(_phi3(gguf, rotary / head_dim) if arch == "phi3" else {}),
        **longrope(gguf),
        **(_gemma(gguf, arch, head_dim, d_model // heads) if arch in NORMS_PLUS_ONE else {}),
    }


def _gemma(gguf: GGUFFile, arch: str, head_dim: int, width_per_head: int) -> dict[str, Any]:
    """Gemma's own fields, as llama.cpp reads them: the score scale (1/sqrt(head_dim), a 27B's
    1/sqrt(d_model/heads), or `attention.scale`), soft-caps, the window and its layers."""
    scale = gguf.get(f"{arch}.attention.scale")
    layers = int(_field(gguf, arch, "block_count"))
    scalar = width_per_head if layers == LAYERS_27B[arch] else head_dim
    fields: dict[str, Any] = {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scale**-2 if isinstance(scale, float) and scale > 0 else scalar,
        "attn_logit_softcapping": gguf.get(f"{arch}.attn_logit_softcapping"),
        "final_logit_softcapping": gguf.get(f"{arch}.final_logit_softcapping"),
        "sliding_window": gguf.get(f"{arch}.attention.sliding_window"),
    }
    pattern = gguf.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer: true for a sliding one
        fields["layer_types"] = ["sliding_attention" if f else "full_attention" for f in pattern]
    elif isinstance(pattern, int):
        fields["sliding_window_pattern"] = pattern
    if arch == "gemma3":
        fields["rope_local_base_freq"] = float(gguf.get(f"{arch}.rope.freq_base_swa", 10000.0))
    return fields


def _phi3(gguf: GGUFFile, partial_rotary: float) -> dict[str, Any]:
    """Phi-3's own fields: partial rotary (Phi-4-mini), its window, its original context."""
    context = int(_field(gguf, "phi3", "context_length", 4096))
    window = gguf.get("phi3.attention.sliding_window")
    return {
        "partial_rotary_factor": partial_rotary,
        "original_max_position_embeddings": int(
            gguf.get("phi3.rope.scaling.original_context_length", context)
        ),
        "sliding_window": window if isinstance(window, int) and window > 0 else None,
    }


def rope_factor_names(gguf: GGUFFile) -> set[str]:
    """The LongRoPE factor tensors of a long-context Phi-3 file (none in others): config, not
    weights."""
    if architecture(gguf) != "phi3":
        return set()
    return {name for name in gguf.tensors if name in LONGROPE_TENSORS.values()}


def longrope(gguf: GGUFFile) -> dict[str, Any]:
    """The `rope_scaling` of a Phi-3 file with LongRoPE factor tensors (llama.cpp writes them
    from the checkpoint's `short_factor` and `long_factor`, with the cos/sin scale as
    `phi3.rope.scaling.attn_factor`); {} without them."""
    names = rope_factor_names(gguf)
    if not names:
        return {}
    missing = sorted(set(LONGROPE_TENSORS.values()) - names)
    if missing:
        raise gguf.error(f"it holds {sorted(names)} but not {missing}; LongRoPE needs both")
    scaling: dict[str, Any] = {"rope_type": "longrope"}
    for field, name in LONGROPE_TENSORS.items():
        info = gguf.tensors[name]
        values = dequantize(info.data, info.ggml_type, info.shape).astype(np.float32)
        scaling[field] = [float(v) for v in values.reshape(-1)]
    attention = gguf.get("phi3.rope.scaling.attn_factor")
    if isinstance(attention, float):
        scaling["attention_factor"] = attention
    return {"rope_scaling": scaling}


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query/key row order: within each head, its converter interleaves the
    first and second halves of the rows; the original order takes them back apart."""
    half = rows.shape[0] // heads // 2
    grouped = rows.reshape(heads, half, 2, *rows.shape[1:])
    return grouped.swapaxes(1, 2).reshape(rows.shape)


def hf_state_dict(
    gguf: GGUFFile, config: dict[str, Any], tensors: dict[str, np.ndarray]
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
