"""A GGUF file's sizes: each size its metadata gives is checked before the model is built and
before any tensor is read, and against the shapes of its tensor table; a refusal names the key,
its value and, where they disagree, the tensor's shape."""

from __future__ import annotations

import numpy as np
import pytest

import zoo
import zoo.interop.gguf.load
from zoo.interop.gguf import GGUFError

pytestmark = pytest.mark.hf
gguf = pytest.importorskip("gguf")

D_MODEL, HEADS, KV_HEADS, HEAD_DIM, D_FF, VOCAB = 8, 2, 1, 4, 16, 12
SIZES = {
    "block_count": 1,
    "context_length": 32,
    "embedding_length": D_MODEL,
    "feed_forward_length": D_FF,
    "attention.head_count": HEADS,
    "attention.head_count_kv": KV_HEADS,
    "attention.layer_norm_rms_epsilon": 1e-5,
    "rope.freq_base": 10000.0,
}
SHAPES = {
    "token_embd.weight": (VOCAB, D_MODEL),
    "output_norm.weight": (D_MODEL,),
    "blk.0.attn_norm.weight": (D_MODEL,),
    "blk.0.ffn_norm.weight": (D_MODEL,),
    "blk.0.attn_q.weight": (HEADS * HEAD_DIM, D_MODEL),
    "blk.0.attn_k.weight": (KV_HEADS * HEAD_DIM, D_MODEL),
    "blk.0.attn_v.weight": (KV_HEADS * HEAD_DIM, D_MODEL),
    "blk.0.attn_output.weight": (D_MODEL, HEADS * HEAD_DIM),
    "blk.0.ffn_gate.weight": (D_FF, D_MODEL),
    "blk.0.ffn_up.weight": (D_FF, D_MODEL),
    "blk.0.ffn_down.weight": (D_MODEL, D_FF),
}


def write_llama(path, sizes=None, shapes=None, tokens=None):
    """A one-layer llama file of float32 zeros, its metadata `SIZES` updated by `sizes` (a
    None value leaves the key out) and its tensors `SHAPES` by `shapes`."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {**SIZES, **(sizes or {})}.items():
        if isinstance(value, float):
            writer.add_float32(f"llama.{key}", value)
        elif isinstance(value, int):
            writer.add_int64(f"llama.{key}", value)
        elif isinstance(value, str):
            writer.add_string(f"llama.{key}", value)
    if tokens is not None:
        writer.add_token_list(tokens)
    for name, shape in {**SHAPES, **(shapes or {})}.items():
        writer.add_tensor(name, np.zeros(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def no_tensor_read(monkeypatch):
    """Any tensor read fails the test: a refusal must come before them."""

    def read_tensors(*args, **kwargs):
        raise AssertionError("a tensor was read before the metadata was checked")

    monkeypatch.setattr(zoo.interop.gguf.load, "read_tensors", read_tensors)


def refused(path, match: str) -> str:
    with pytest.raises(GGUFError, match=match) as caught:
        zoo.from_pretrained(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_consistent_file_loads(tmp_path):
    model = zoo.from_pretrained(write_llama(tmp_path / "m.gguf", tokens=["a"] * (VOCAB - 2)))
    config = model.config
    assert (config.vocab_size, config.d_model, config.max_positions) == (VOCAB, D_MODEL, 32)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("attention.head_count", 0),
        ("attention.head_count", -2),
        ("attention.head_count_kv", 0),
        ("block_count", 0),
        ("context_length", 0),
        ("embedding_length", 0),
        ("feed_forward_length", 0),
        ("vocab_size", 0),
        ("attention.key_length", 0),
        ("rope.dimension_count", -4),
    ],
)
def test_a_size_that_is_no_size_is_refused_by_key_and_value(tmp_path, no_tensor_read, key, value):
    path = write_llama(tmp_path / "m.gguf", {key: value})
    refused(path, rf"llama.{key} is {value}; it must be a positive integer$")


@pytest.mark.parametrize("key", ["rope.freq_base", "attention.layer_norm_rms_epsilon"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -float("inf")])
def test_rope_and_norm_values_must_be_finite(tmp_path, no_tensor_read, key, value):
    refused(write_llama(tmp_path / "m.gguf", {key: value}), rf"llama.{key} is {value}; it must be")


def test_rope_base_and_scaling_must_be_positive(tmp_path, no_tensor_read):
    refused(write_llama(tmp_path / "m.gguf", {"rope.freq_base": 0.0}), r"freq_base is 0.0; it must")
    scaled = {"rope.scaling.type": "linear", "rope.scaling.factor": float("inf")}
    refused(write_llama(tmp_path / "m.gguf", scaled), r"llama.rope.scaling.factor is inf; it must")


def test_heads_must_divide_what_they_split(tmp_path, no_tensor_read):
    refused(
        write_llama(tmp_path / "m.gguf", {"attention.head_count": 3}),
        r"llama.attention.head_count is 3, which does not divide llama.embedding_length 8, and "
        r"the file gives no llama.attention.key_length",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"attention.head_count_kv": 3, "attention.head_count": 4}),
        r"llama.attention.head_count_kv is 3, which does not divide llama.attention.head_count 4",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"rope.dimension_count": 3}),
        r"llama.rope.dimension_count is 3; it must be an even width of at most the 4 of a head",
    )


def test_metadata_that_disagrees_with_the_tensors_is_refused(tmp_path, no_tensor_read):
    refused(
        write_llama(tmp_path / "m.gguf", {"embedding_length": 512}),
        r"llama.embedding_length is 512, but token_embd.weight has shape \(12, 8\) \(8 wide\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"vocab_size": 2**31 - 1}),
        r"llama.vocab_size is 2147483647, but token_embd.weight has shape \(12, 8\) \(12 rows\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", tokens=["a"] * (VOCAB + 3)),
        r"tokenizer.ggml.tokens lists 15 tokens, but token_embd.weight has shape \(12, 8\): 3",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"block_count": 5}),
        r"llama.block_count is 5, but the tensors hold 1 layers \(blk.0\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"feed_forward_length": 32}),
        r"blk.0.ffn_gate.weight has shape \(16, 8\), but llama.feed_forward_length 32 and "
        r"llama.embedding_length 8 make it \(32, 8\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"attention.key_length": 8}),
        r"blk.0.attn_q.weight has shape \(8, 8\), but llama.attention.head_count 2, "
        r"llama.attention.key_length 8 and llama.embedding_length 8 make it \(16, 8\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", {"attention.head_count": 4, "attention.head_count_kv": 4}),
        r"blk.0.attn_k.weight has shape \(4, 8\), but llama.attention.head_count_kv 4, the head "
        r"width 2 and llama.embedding_length 8 make it \(8, 8\)",
    )
    refused(
        write_llama(tmp_path / "m.gguf", shapes={"blk.0.attn_norm.weight": (6,)}),
        r"blk.0.attn_norm.weight has shape \(6,\), but llama.embedding_length 8 makes it \(8,\)",
    )


def test_a_padded_vocabulary_loads(tmp_path):
    """Fewer tokens than embedding rows is padding (Qwen's files pad their 151,665 tokens to
    151,936 rows), not a disagreement."""
    path = write_llama(tmp_path / "m.gguf", {"vocab_size": VOCAB}, tokens=["a"] * (VOCAB - 4))
    assert zoo.from_pretrained(path).config.vocab_size == VOCAB
