"""A GGUF file's sizes, read from its metadata and checked before anything is built from them.

Each size a model is built from is read once here and refused, naming its key and value, when
it is no size at all (zero heads, no layers, an infinite rope base), when it does not divide
what it must (heads into the width, when the file gives no head width; key/value heads into
heads), or when it disagrees with the tensor table: `embedding_length` 512 beside 576-wide
tensors, `vocab_size` or a token list longer than the embedding's rows, `block_count` beside
the layers the tensors number, a projection whose shape the heads and widths do not make. Only
the tensor table's shapes are read, so a file is refused before any of its tensor data is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from zoo.interop.gguf.reader import GGUFFile, GGUFScalar

LAYER_INDEX = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The sizes of the model a GGUF file holds, each checked (`read_sizes`)."""

    vocab: int  # rows of token_embd.weight
    d_model: int  # its width, as embedding_length gives it
    heads: int  # attention.head_count
    kv_heads: int  # attention.head_count_kv (heads where absent)
    head_dim: int  # attention.key_length (d_model / heads where absent)
    d_ff: int  # feed_forward_length
    layers: int  # block_count
    context: int  # context_length
    rotary: int  # rope.dimension_count: the rotated width of each head (head_dim where absent)


def field(gguf: GGUFFile, arch: str, key: str, default: GGUFScalar | None = None) -> GGUFScalar:
    """`{arch}.{key}`, which a model of `arch` needs (`default` where there is none); a
    per-layer list must hold one value for every layer."""
    value = gguf.get(f"{arch}.{key}", default)
    if value is None:
        raise gguf.error(f"the metadata lacks {arch}.{key}, which a {arch} model needs")
    if isinstance(value, list):  # a per-layer list: zoo gives every layer the same
        if len(set(value)) != 1:
            raise gguf.error(f"{arch}.{key} differs between layers ({value}); zoo needs one value")
        value = value[0]
    return value


def int_field(gguf: GGUFFile, arch: str, key: str, default: int | None = None) -> int:
    """`field` of an integer setting (a count, a width, a length)."""
    value = field(gguf, arch, key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise gguf.error(f"{arch}.{key} is {value!r}, not an integer")


def positive_field(gguf: GGUFFile, arch: str, key: str, default: int | None = None) -> int:
    """`int_field` of a count or a width, which must be at least 1."""
    value = int_field(gguf, arch, key, default)
    if value < 1:
        raise gguf.error(f"{arch}.{key} is {value}; it must be a positive integer")
    return value


def float_field(
    gguf: GGUFFile, arch: str, key: str, default: float | None = None, *, positive: bool = False
) -> float:
    """`field` of a real-valued setting (an epsilon, a base, a factor): a finite number, and
    above 0 where `positive`."""
    value = field(gguf, arch, key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise gguf.error(f"{arch}.{key} is {value!r}, not a number")
    if not math.isfinite(value) or (positive and value <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise gguf.error(f"{arch}.{key} is {value}; it must be {kind}")
    return float(value)


def read_sizes(gguf: GGUFFile, arch: str) -> Sizes:
    """The sizes of the file's model (see the module doc), each checked against the others
    and against the tensor table."""
    if "token_embd.weight" not in gguf.tensors:
        raise gguf.error("it holds no token_embd.weight, the embedding every model has")
    shape = gguf.tensors["token_embd.weight"].shape
    if len(shape) != 2:
        raise gguf.error(f"token_embd.weight has shape {shape}, not (vocabulary, width)")
    rows, width = shape
    d_model = positive_field(gguf, arch, "embedding_length", width)
    if d_model != width:
        raise gguf.error(
            f"{arch}.embedding_length is {d_model}, but token_embd.weight has shape {shape} "
            f"({width} wide): the metadata does not describe these tensors"
        )
    vocab = positive_field(gguf, arch, "vocab_size", rows)
    tokens = gguf.get("tokenizer.ggml.tokens")
    if vocab != rows:
        raise gguf.error(
            f"{arch}.vocab_size is {vocab}, but token_embd.weight has shape {shape} ({rows} "
            "rows): the metadata does not describe these tensors"
        )
    if isinstance(tokens, list) and len(tokens) > rows:  # fewer is padding, as in Qwen's
        raise gguf.error(
            f"tokenizer.ggml.tokens lists {len(tokens)} tokens, but token_embd.weight has shape "
            f"{shape}: {len(tokens) - rows} tokens would have no embedding row"
        )
    heads = positive_field(gguf, arch, "attention.head_count")
    kv_heads = positive_field(gguf, arch, "attention.head_count_kv", heads)
    if heads % kv_heads:
        raise gguf.error(
            f"{arch}.attention.head_count_kv is {kv_heads}, which does not divide "
            f"{arch}.attention.head_count {heads}: each key/value head serves a group of heads"
        )
    if gguf.get(f"{arch}.attention.key_length") is None and d_model % heads:
        raise gguf.error(
            f"{arch}.attention.head_count is {heads}, which does not divide "
            f"{arch}.embedding_length {d_model}, and the file gives no "
            f"{arch}.attention.key_length (the width of a head)"
        )
    head_dim = positive_field(gguf, arch, "attention.key_length", d_model // heads)
    rotary = positive_field(gguf, arch, "rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise gguf.error(
            f"{arch}.rope.dimension_count is {rotary}; it must be an even width of at most "
            f"the {head_dim} of a head (rotary pairs of each head)"
        )
    sizes = Sizes(
        vocab=vocab,
        d_model=d_model,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        d_ff=positive_field(gguf, arch, "feed_forward_length"),
        layers=positive_field(gguf, arch, "block_count"),
        context=positive_field(gguf, arch, "context_length", 2048),
        rotary=rotary,
    )
    _check_layers(gguf, arch, sizes.layers)
    _check_shapes(gguf, arch, sizes)
    return sizes


def _check_layers(gguf: GGUFFile, arch: str, layers: int) -> None:
    """Refuse a `block_count` other than the number of layers the tensors hold."""
    found = {int(m.group(1)) for name in gguf.tensors if (m := LAYER_INDEX.match(name))}
    if found and found != set(range(layers)):
        numbered = f"blk.{min(found)}..blk.{max(found)}" if len(found) > 1 else f"blk.{min(found)}"
        raise gguf.error(
            f"{arch}.block_count is {layers}, but the tensors hold {len(found)} layers "
            f"({numbered}): the metadata does not describe these tensors"
        )


def _check_shapes(gguf: GGUFFile, arch: str, sizes: Sizes) -> None:
    """Refuse a weight whose shape the sizes do not make, naming the keys that make it."""
    expected, keys = _expected_shapes(gguf, arch, sizes)
    for name, info in gguf.tensors.items():
        match = LAYER_INDEX.match(name)
        part, _, kind = (name[match.end() :] if match else name).rpartition(".")
        if part not in expected:
            continue  # a tensor with no place is refused by its name elsewhere
        shape = expected[part] if kind == "weight" else expected[part][:1]
        if info.shape != shape:
            *first, last = keys[part]
            named = f"{', '.join(first)} and {last} make" if first else f"{last} makes"
            raise gguf.error(
                f"{name} has shape {info.shape}, but {named} it {shape}: the metadata does not "
                "describe these tensors"
            )


def _expected_shapes(
    gguf: GGUFFile, arch: str, sizes: Sizes
) -> tuple[dict[str, tuple[int, ...]], dict[str, list[str]]]:
    """Each weight's shape as the sizes make it (numpy order), and the keys (with their
    values) it is made from."""
    d_model, d_ff = sizes.d_model, sizes.d_ff
    query, key_value = sizes.heads * sizes.head_dim, sizes.kv_heads * sizes.head_dim
    width = f"{arch}.embedding_length {d_model}"
    if gguf.get(f"{arch}.attention.key_length") is None:
        head = f"the head width {sizes.head_dim}"
    else:
        head = f"{arch}.attention.key_length {sizes.head_dim}"
    heads = f"{arch}.attention.head_count {sizes.heads}"
    kv_heads = f"{arch}.attention.head_count_kv {sizes.kv_heads}"
    ff = f"{arch}.feed_forward_length {d_ff}"
    vocab = f"token_embd.weight's {sizes.vocab} rows"
    norm = ((d_model,), [width])
    parts = {
        "output_norm": norm,
        "attn_norm": norm,
        "ffn_norm": norm,
        "post_attention_norm": norm,
        "post_ffw_norm": norm,
        "output": ((sizes.vocab, d_model), [vocab, width]),
        "attn_q": ((query, d_model), [heads, head, width]),
        "attn_k": ((key_value, d_model), [kv_heads, head, width]),
        "attn_v": ((key_value, d_model), [kv_heads, head, width]),
        "attn_output": ((d_model, query), [width, heads, head]),
        "attn_q_norm": ((sizes.head_dim,), [head]),
        "attn_k_norm": ((sizes.head_dim,), [head]),
        "ffn_gate": ((d_ff, d_model), [ff, width]),
        "ffn_up": ((d_ff, d_model), [ff, width]),
        "ffn_down": ((d_model, d_ff), [width, ff]),
    }
    if arch == "phi3":  # fused: query, key and value rows; gate and up rows
        qkv = [heads, kv_heads, head, width]
        parts["attn_qkv"] = ((query + 2 * key_value, d_model), qkv)
        parts["ffn_up"] = ((2 * d_ff, d_model), [ff, width])
    return {p: s for p, (s, _) in parts.items()}, {p: k for p, (_, k) in parts.items()}
