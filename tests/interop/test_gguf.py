"""GGUF files against transformers: tiny Llama files written here with the `gguf` package's
writer, in several quantization types (the K-quants as random blocks), read by zoo and by
transformers (`gguf_file=`).

(a) dequantization recovers what the package quantized, per type; (b) the logits equal
transformers' within 1e-4; (c) the tokenizers (byte-level BPE and SentencePiece) give
transformers' ids; (d) greedy generation gives transformers' tokens; the q/k row permutation
of llama.cpp is undone (a model whose q/k rows were not permuted back would differ).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.interop.gguf import GGUFError, dequantize, read_gguf, read_tensors, supported_names
from zoo.interop.gguf.model import longrope, unpermute
from zoo.interop.gguf.tokenizer import byte_alphabet

pytestmark = pytest.mark.hf
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
# the types the package can write (quantize); the K-quants it only reads are tested from bytes
WRITABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
# K-quant type -> byte offsets of its fp16 scales within a block
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
TEXTS = ["Hello world", "the tea, then the heat!", "naïve café 東京 🙂\n\tend", "  two  spaces"]
D_MODEL, D_FF, HEADS, KV_HEADS, LAYERS = 32, 256, 4, 2, 2


def random_blocks(qtype, blocks: int, rng) -> np.ndarray:
    """Random K-quant blocks whose fp16 scales are finite numbers in [-1, 1]."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
    for offset in K_SCALES[qtype]:
        scales = rng.uniform(-1, 1, size=(blocks, 1)).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", WRITABLE, ids=lambda q: q.name)
def test_dequantize_recovers_what_the_package_quantized(qtype):
    values = np.random.default_rng(0).normal(size=(3, 128)).astype(np.float32)
    values[0, :32] = 0.0  # an all-zero block: a zero scale
    raw = gguf.quants.quantize(values, qtype)
    ours = dequantize(raw, int(qtype), (3, 128))
    assert ours.dtype == np.float32 and ours.shape == (3, 128)
    assert not np.shares_memory(ours, raw)
    np.testing.assert_array_equal(ours[0, :32], 0.0)
    # each type's error bound relative to the largest value of a block
    bound = {Q.F32: 0, Q.F16: 1e-3, Q.BF16: 4e-3, Q.Q8_0: 5e-3, Q.Q5_0: 0.04, Q.Q5_1: 0.04}
    scale = np.abs(values).reshape(3, 4, 32).max(-1, keepdims=True)
    error = np.abs(ours - values).reshape(3, 4, 32) / np.maximum(scale, 1e-9)
    assert error.max() <= bound.get(qtype, 0.08)


def test_supported_types_are_the_packages():
    names = supported_names().split(", ")
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K", "Q6_K"):
        assert name in names
    assert "I32" not in names and "Q8_1" not in names


def test_unpermute_inverts_llama_cpp_permutation():
    rows = np.arange(2 * 8 * 3).reshape(16, 3)  # 2 heads of 8 rows
    permuted = rows.reshape(2, 2, 4, 3).swapaxes(1, 2).reshape(16, 3)
    np.testing.assert_array_equal(unpermute(permuted, 2), rows)
    # head 0's rows as llama.cpp stores them: 0, 4, 1, 5, ...
    assert permuted[:4, 0].tolist() == [0, 12, 3, 15]


# -- tiny model files -------------------------------------------------------------------------


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """A GPT-2 style vocabulary: the 256 byte characters, a few merges, three control tokens."""
    tokens = [byte_alphabet()[b] for b in range(256)]
    merges = ["h e", "t he", "Ġ the", "Ġ t", "e a", "Ġ w", "o r", "l d", "Ġw or", "Ġwor ld", "H e"]
    tokens += [merge.replace(" ", "") for merge in merges]
    types = [1] * len(tokens)
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(3)
    return tokens, types, merges


def sentencepiece_vocab() -> tuple[list[str], list[int], list[float]]:
    """A Llama-2 style vocabulary: unk/bos/eos, 256 byte tokens, pieces with scores (no merges)."""
    tokens, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    pieces = ["▁", "e", "t", "h", "a", "l", "o", "w", "r", "d", "▁t", "he", "▁the", "▁w", "or"]
    pieces += ["ld", "▁wor", "▁world", "ea", "H", "He", "ll", "llo", "Hello", "n", "c", "é"]
    tokens += pieces
    types += [1] * len(pieces)
    scores += [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """The row order llama.cpp's converter writes q/k projections in."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1)
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def add(writer, name: str, values: np.ndarray, qtype) -> None:
    if qtype in K_SCALES:  # random blocks, as the package cannot quantize to K-quants
        rows = values.shape[0]
        raw = random_blocks(qtype, rows * values.shape[1] // 256, np.random.default_rng(rows))
        writer.add_tensor(name, raw.reshape(rows, -1), raw_dtype=qtype)
    elif qtype == Q.F32:
        writer.add_tensor(name, values.astype(np.float32))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def write_tiny_llama(path, *, tokenizer: str, tied: bool) -> None:
    rng = np.random.default_rng(1)
    if tokenizer == "gpt2":
        tokens, types, merges = byte_level_vocab()
    else:
        tokens, types, scores = sentencepiece_vocab()
    vocab, head_dim = len(tokens), D_MODEL // HEADS
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if tokenizer == "gpt2":
        writer.add_token_merges(merges)
        writer.add_bos_token_id(vocab - 3)
        writer.add_eos_token_id(vocab - 1)
        writer.add_add_bos_token(False)
    else:
        writer.add_token_scores(scores)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )

    def normal(*shape, std=0.3):
        return (std * rng.normal(size=shape)).astype(np.float32)

    add(writer, "token_embd.weight", normal(vocab, D_MODEL), Q.Q8_0)
    add(writer, "output_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
    if not tied:
        add(writer, "output.weight", normal(vocab, D_MODEL), Q.Q4_1)
    kinds = [Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.F16, Q.BF16, Q.Q8_0]
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        add(writer, prefix + "attn_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
        add(writer, prefix + "ffn_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
        q = llama_cpp_permute(normal(D_MODEL, D_MODEL), HEADS)
        k = llama_cpp_permute(normal(KV_HEADS * head_dim, D_MODEL), KV_HEADS)
        add(writer, prefix + "attn_q.weight", q, kinds[layer])
        add(writer, prefix + "attn_k.weight", k, kinds[layer + 1])
        add(
            writer, prefix + "attn_v.weight", normal(KV_HEADS * head_dim, D_MODEL), kinds[layer + 2]
        )
        add(writer, prefix + "attn_output.weight", normal(D_MODEL, D_MODEL), kinds[layer + 3])
        add(writer, prefix + "ffn_gate.weight", normal(D_FF, D_MODEL), kinds[layer + 4])
        add(writer, prefix + "ffn_up.weight", normal(D_FF, D_MODEL), Q.Q4_1)
        add(writer, prefix + "ffn_down.weight", normal(D_MODEL, D_FF), [Q.Q6_K, Q.Q4_K][layer])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=["gpt2-tied", "llama-untied"])
def tiny(request, tmp_path_factory):
    tokenizer, tying = request.param.split("-")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama(path, tokenizer=tokenizer, tied=tying == "tied")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model, tokenizer = zoo.from_pretrained(path, return_tokenizer=True)
    return path, hf, hf_tokenizer, model, tokenizer


def test_every_tensor_equals_the_gguf_readers(tiny):
    path = tiny[0]
    reader = gguf.GGUFReader(str(path))
    theirs = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    ours = dict(read_tensors(read_gguf(path)))
    assert ours.keys() == theirs.keys()
    for name, values in ours.items():
        np.testing.assert_array_equal(values, theirs[name].astype(np.float32), err_msg=name)


def test_logits_equal_transformers(tiny):
    _, hf, _, model, _ = tiny
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, size=11)
    with torch.no_grad():
        theirs = hf(torch.tensor(ids[None])).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray(ids)))
    assert np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    assert model.config.head.tie == (hf.config.tie_word_embeddings is True)


def test_tokenizer_ids_equal_transformers(tiny):
    _, _, hf_tokenizer, _, tokenizer = tiny
    for text in [*TEXTS, "<|im_start|>Hello<|im_end|>"]:
        theirs = hf_tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.encode(text) == theirs, text
    assert tokenizer.eos_id == hf_tokenizer.eos_token_id
    assert tokenizer.bos_id == hf_tokenizer.bos_token_id
    assert "<|im_start|>" in tokenizer.chat_template


def test_greedy_generation_equals_transformers(tiny):
    path, hf = tiny[:2]
    prompt = [5, 17, 3, 44, 8, 21]
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )[:, len(prompt) :].numpy()
    no_end = zoo.from_pretrained(path, eos_id=None, stop_ids=())
    ours = zoo.generate(no_end, [prompt], max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_bfloat16_loads_in_bfloat16(tiny):
    model = zoo.from_pretrained(tiny[0], dtype="bfloat16")
    assert model.config.dtype == "bfloat16"
    leaves = [x for x in jax.tree.leaves(model) if isinstance(x, jax.Array)]
    assert leaves and {x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)} == {
        jnp.dtype(jnp.bfloat16)
    }


def test_zoo_generate_reads_the_file(tiny, capsys):
    from zoo.cli import main
    from zoo.decoding.text import generate_texts

    path, _, _, model, tokenizer = tiny
    if tokenizer.adds_bos:  # one file is enough for the command line; the byte-level one
        pytest.skip("the command line is tested on the byte-level file")
    args = ["generate", str(path), "--prompt", "Hello the", "--max-new-tokens", "6", "--json"]
    assert main(args) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert row["output"] == generate_texts(model, tokenizer, ["Hello the"], max_new_tokens=6)[0]


def test_a_broken_tokenizer_is_refused_by_name(tmp_path):
    from zoo.interop.gguf import GGUFFile, gguf_tokenizer

    def file(**metadata):
        keys = {f"tokenizer.ggml.{name}": value for name, value in metadata.items()}
        return GGUFFile(tmp_path / "t.gguf", 3, keys, {})

    with pytest.raises(GGUFError, match=r"t.gguf: tokenizer.ggml.model 'bert' is not supported"):
        gguf_tokenizer(file(model="bert", tokens=["a"]))
    with pytest.raises(GGUFError, match=r"merges holds 'ab', not two tokens and a space"):
        gguf_tokenizer(file(model="gpt2", tokens=["a", "b", "ab"], merges=["ab"]))
    with pytest.raises(GGUFError, match=r"its tokenizer is inconsistent"):
        gguf_tokenizer(file(model="gpt2", tokens=["a", "b"], merges=["a c"]))
    with pytest.raises(GGUFError, match=r"t.gguf: tokenizer.ggml.scores is not a list of numbers"):
        gguf_tokenizer(file(model="llama", tokens=["a", "b", "ab"], scores=["0", "-1", "-2"]))
    with pytest.raises(GGUFError, match=r"t.gguf: tokenizer.ggml.token_type is not a list"):
        gguf_tokenizer(file(model="gpt2", tokens=["a", "b", "ab"], merges=["a b"], token_type=3))
    with pytest.raises(GGUFError, match=r"t.gguf: tokenizer.ggml.model \['gpt2'\] is not"):
        gguf_tokenizer(file(model=["gpt2"], tokens=["a"]))


def write_tiny_phi3(path, *, rotary: int, longrope: dict | None = None) -> None:
    """A Phi-3 file as llama.cpp writes one: fused `attn_qkv` and gate/up `ffn_up`, unpermuted
    rows, a SentencePiece vocabulary, `rotary` of each 8-wide head rotating; with `longrope`
    (short, long, original, attn_factor) the factor tensors and metadata of a 128k model."""
    rng = np.random.default_rng(3)
    tokens, types, scores = sentencepiece_vocab()
    vocab, head_dim = len(tokens), D_MODEL // HEADS
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(rotary)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    if longrope:
        writer.add_rope_scaling_orig_ctx_len(longrope["original"])
        writer.add_rope_scaling_attn_factors(longrope["attn_factor"])
        for kind in ("short", "long"):
            factors = np.asarray(longrope[kind], np.float32)
            add(writer, f"rope_factors_{kind}.weight", factors, Q.F32)

    def normal(*shape, std=0.3):
        return (std * rng.normal(size=shape)).astype(np.float32)

    add(writer, "token_embd.weight", normal(vocab, D_MODEL), Q.Q8_0)
    add(writer, "output_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
    add(writer, "output.weight", normal(vocab, D_MODEL), Q.Q4_1)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        add(writer, prefix + "attn_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
        add(writer, prefix + "ffn_norm.weight", 1 + normal(D_MODEL, std=0.1), Q.F32)
        qkv_rows = (HEADS + 2 * KV_HEADS) * head_dim
        add(writer, prefix + "attn_qkv.weight", normal(qkv_rows, D_MODEL), Q.Q8_0)
        add(writer, prefix + "attn_output.weight", normal(D_MODEL, D_MODEL), Q.F16)
        add(writer, prefix + "ffn_up.weight", normal(2 * D_FF, D_MODEL), Q.Q5_1)
        add(writer, prefix + "ffn_down.weight", normal(D_MODEL, D_FF), Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_phi3_logits_equal_transformers(tmp_path):
    path = tmp_path / "phi3.gguf"
    write_tiny_phi3(path, rotary=D_MODEL // HEADS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    model = zoo.from_pretrained(path)
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, size=9)
    with torch.no_grad():
        theirs = hf(torch.tensor(ids[None])).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray(ids)))
    assert np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_phi3_partial_rotary_is_read(tmp_path):
    # transformers' GGUF loading ignores phi3.rope.dimension_count; llama.cpp rotates that many
    path = tmp_path / "phi4-mini.gguf"
    write_tiny_phi3(path, rotary=6)
    rope = zoo.from_pretrained(path).config.layers.block.attention.rope
    assert rope.partial_rotary_factor == 0.75


def test_phi3_longrope_factors_are_read_as_transformers_computes_them(tmp_path):
    """A long-context Phi-3 file (Phi-3.5-mini, Phi-4-mini as llama.cpp converts them) keeps
    its LongRoPE factors as tensors. transformers' GGUF loading drops them; the reference is
    its Phi-3 with the same weights and the checkpoint's `rope_scaling`, within and past the
    original 8 positions."""
    longrope = dict(short=[1.0, 1.25, 1.5, 2.0], long=[2.0, 4.0, 8.0, 16.0], original=8)
    longrope["attn_factor"] = 1.125  # llama.cpp's cos/sin scale, kept as written
    plain, scaled = tmp_path / "plain" / "phi3.gguf", tmp_path / "phi35.gguf"
    plain.parent.mkdir()
    write_tiny_phi3(plain, rotary=D_MODEL // HEADS)
    write_tiny_phi3(scaled, rotary=D_MODEL // HEADS, longrope=longrope)
    model = zoo.from_pretrained(scaled)
    rope = model.config.layers.block.attention.rope
    assert (rope.scaling, rope.short_factor, rope.long_factor) == (
        "longrope",
        tuple(longrope["short"]),
        tuple(longrope["long"]),
    )
    assert (rope.original_max_positions, rope.factor, rope.table_scale) == (8, 64 / 8, 1.125)
    weights = transformers.AutoModelForCausalLM.from_pretrained(
        str(plain.parent), gguf_file=plain.name, dtype=torch.float32
    )
    config = weights.config
    config.rope_parameters = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": longrope["short"],
        "long_factor": longrope["long"],
        "original_max_position_embeddings": 8,
        "attention_factor": 1.125,
    }
    config.original_max_position_embeddings = 8
    hf = transformers.Phi3ForCausalLM(config).eval()
    hf.load_state_dict(weights.state_dict())
    for length in (6, 13):
        ids = np.random.default_rng(length).integers(3, model.config.vocab_size, size=length)
        with torch.no_grad():
            theirs = hf(torch.tensor(ids[None])).logits[0].numpy()
        ours = np.asarray(model(jnp.asarray(ids)))
        np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_phi3_with_one_longrope_factor_tensor_is_refused(tmp_path):
    path = tmp_path / "broken.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    add(writer, "token_embd.weight", np.zeros((8, D_MODEL), np.float32), Q.F32)
    add(writer, "rope_factors_long.weight", np.ones(4, np.float32), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        GGUFError, match=r"holds \['rope_factors_long.weight'\] but not \['rope_factors_short"
    ):
        longrope(read_gguf(path))


def write_tiny_gemma(path, arch: str) -> None:
    """A Gemma 2 or 3 file as llama.cpp writes one: norm weights stored plus 1, a norm before
    and after attention and feed-forward, tied embeddings, 256-wide heads (the score scale
    transformers' GGUF loading assumes), a 4-token window on the sliding layers."""
    rng = np.random.default_rng(5)
    tokens, types, scores = sentencepiece_vocab()
    vocab, heads, head_dim = len(tokens), 2, 256
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0 if arch == "gemma2" else 1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(4)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    writer.add_tokenizer_model("llama")
    writer.add_add_space_prefix(False)  # as llama.cpp writes Gemma's SentencePiece model
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)

    def normal(*shape, std=0.3):
        return (std * rng.normal(size=shape)).astype(np.float32)

    def norm(size):  # llama.cpp writes a Gemma norm's weight plus 1
        return 1 + normal(size, std=0.1)

    add(writer, "token_embd.weight", normal(vocab, D_MODEL), Q.Q8_0)
    add(writer, "output_norm.weight", norm(D_MODEL), Q.F32)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            add(writer, f"{prefix}{name}.weight", norm(D_MODEL), Q.F32)
        if arch == "gemma3":
            add(writer, prefix + "attn_q_norm.weight", norm(head_dim), Q.F32)
            add(writer, prefix + "attn_k_norm.weight", norm(head_dim), Q.F32)
        add(writer, prefix + "attn_q.weight", normal(heads * head_dim, D_MODEL, std=0.1), Q.Q8_0)
        add(writer, prefix + "attn_k.weight", normal(head_dim, D_MODEL, std=0.1), Q.F16)
        add(writer, prefix + "attn_v.weight", normal(head_dim, D_MODEL), Q.Q5_0)
        add(writer, prefix + "attn_output.weight", normal(D_MODEL, heads * head_dim), Q.Q4_0)
        add(writer, prefix + "ffn_gate.weight", normal(D_FF, D_MODEL), Q.Q4_1)
        add(writer, prefix + "ffn_up.weight", normal(D_FF, D_MODEL), Q.BF16)
        add(writer, prefix + "ffn_down.weight", normal(D_MODEL, D_FF), Q.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_logits_equal_transformers(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_gemma(path, arch)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    model, tokenizer = zoo.from_pretrained(path, return_tokenizer=True)
    block = model.config.layers.block
    assert block.attention.window == 4 and block.norm.weight_offset == 1.0
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS:
        assert tokenizer.encode(text) == hf_tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.decode(tokenizer.encode(text)) == text
    ids = np.random.default_rng(6).integers(0, model.config.vocab_size, size=9)
    with torch.no_grad():
        theirs = hf(torch.tensor(ids[None])).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray(ids)))
    assert np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
