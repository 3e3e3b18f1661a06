"""Llama, Mistral, Qwen2 and Qwen3 <-> zoo.GPT parity with transformers.

Tiny random models of each family, varied over the parts that tell them apart (GQA ratio,
explicit head_dim, tied and untied heads, q/k/v biases, QK-norm, a sliding window shorter than
the sequence, llama3 rotary scaling): per-layer hidden states and logits, greedy generation
with left padding, cached decoding, sharded bf16 hub folders, export, and a bf16 tier.
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hf_helpers import (
    LOGIT_TOL,
    check_preset_count,
    max_diff,
    randomize,
    record,
    tensor,
    torch,
    transformers,
)

import zoo
from zoo.interop import (
    CheckpointMismatch,
    UnsupportedConfig,
    from_hf,
    from_pretrained,
    load_state_dict,
    save_hf,
    to_hf,
)
from zoo.interop.weights import write_safetensors
from zoo.models.common import token_positions
from zoo.nn import BlockInputs, Mask
from zoo.nn.multihead import QKNorm
from zoo.records import get_path

pytestmark = pytest.mark.hf

SMALL = dict(vocab_size=61, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
VARIANTS = {
    # GQA 2:1, tied head, llama3 rotary scaling
    "llama-gqa2-tied-llama3": (
        "LlamaForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling=LLAMA3_ROPE,
        ),
    ),
    # multi-query (1 kv head), untied, biases on every attention projection and the MLP
    "llama-mqa-bias": (
        "LlamaForCausalLM",
        dict(
            hidden_size=24,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=1,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
        ),
    ),
    # no GQA (4 kv heads), a window of 3 positions on a sequence of 8
    "mistral-window3": (
        "MistralForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            sliding_window=3,
        ),
    ),
    # GQA 3:1, q/k/v biases only, tied
    "qwen2-gqa3-bias-tied": (
        "Qwen2ForCausalLM",
        dict(
            hidden_size=48,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
    ),
    # explicit head_dim (4 heads of 12 != 32 / 4), QK-norm, untied
    "qwen3-headdim12": (
        "Qwen3ForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
        ),
    ),
}
CONFIG_CLASSES = {
    "LlamaForCausalLM": "LlamaConfig",
    "MistralForCausalLM": "MistralConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen3ForCausalLM": "Qwen3Config",
}
# right-padded batch: the second row has three padding positions
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 4, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(variant: str, seed: int = 0, dtype=None):
    class_name, fields = VARIANTS[variant]
    config = getattr(transformers, CONFIG_CLASSES[class_name])(**SMALL, **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = randomize(getattr(transformers, class_name)(config), seed=seed)
    return model if dtype is None else model.to(dtype)


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    """(variant, transformers model, zoo model, HF fp32 outputs on the padded batch)."""
    hf = make_hf(request.param)
    with torch.no_grad():
        outputs = hf(tensor(TOKENS), attention_mask=tensor(REAL), output_hidden_states=True)
    return request.param, hf, from_hf(hf), outputs


@eqx.filter_jit
def hidden_states(model, tokens, real):
    """The embeddings and every layer's output, one example (the blocks run one by one)."""
    positions = token_positions(real, tokens.shape[0])
    window = model.config.layers.block.attention.window
    mask = Mask.keys(real, tokens.shape[0], causal=True, window=window)
    x = model.embedder(tokens, positions)
    states = [x]
    for index in range(model.config.num_layers):
        x, _ = model.layers.layer(index)(x, BlockInputs(mask=mask, positions=positions))
        states.append(x)
    return jnp.stack(states)


def test_logits_and_every_layer_match_on_a_padded_batch(run):
    variant, _, model, outputs = run
    logits = jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    diff = max_diff(logits, outputs.logits.numpy(), REAL)
    record(variant, diff)
    assert diff < LOGIT_TOL
    states = jax.vmap(hidden_states, in_axes=(None, 0, 0))(
        model, jnp.asarray(TOKENS), jnp.asarray(REAL, bool)
    )
    # transformers' last hidden state has the final norm applied; the layers before do not
    for layer, theirs in enumerate(outputs.hidden_states[:-1]):
        assert max_diff(states[:, layer], theirs.numpy(), REAL) < LOGIT_TOL, f"layer {layer}"


def test_the_zoo_config_says_what_each_family_is(run):
    variant, _, model, _ = run
    c = model.config
    block = c.layers.block
    rotary = c.embedder.positions == "none" and block.attention.rope is not None
    assert (block.norm.kind, rotary, block.feed_forward.kind, block.feed_forward.activation) == (
        "rmsnorm",
        True,
        "gated",
        "silu",
    )
    expected = {
        "llama-gqa2-tied-llama3": {
            "kv_heads": 2,
            "head_dim": 8,
            "head.tie": True,
            "attention.qk_norm": None,
        },
        "llama-mqa-bias": {
            "kv_heads": 1,
            "head_dim": 8,
            "attention.qkv_bias": True,
            "feed_forward.bias": True,
        },
        "mistral-window3": {"kv_heads": 4, "attention.window": 3, "head.tie": False},
        "qwen2-gqa3-bias-tied": {
            "attention.qkv_bias": True,
            "attention.output_bias": False,
            "kv_heads": 2,
        },
        "qwen3-headdim12": {
            "head_dim": 12,
            "attention.qk_norm": QKNorm(eps=1e-6),
            "head.tie": False,
        },
    }[variant]

    def value(name):
        if "." not in name:  # a derived size
            return getattr(c, name)
        (path,) = c.paths(name)
        return get_path(c, path)

    assert {name: value(name) for name in expected} == expected


def test_greedy_generation_with_left_padding_matches_transformers(run):
    _, hf, _, _ = run
    prompts = [[5, 17, 3, 44, 8, 21], [12, 7, 33]]
    width = max(map(len, prompts))
    left = np.array([[0] * (width - len(p)) + p for p in prompts])
    left_real = (np.arange(width)[None, :] >= (width - np.array([6, 3]))[:, None]).astype(int)
    with torch.no_grad():
        theirs = hf.generate(
            tensor(left),
            attention_mask=tensor(left_real),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )[:, width:].numpy()
    no_end = from_hf(hf, eos_id=None)  # run all 20 steps on both sides
    ours = zoo.generate(no_end, prompts, max_new_tokens=20)
    np.testing.assert_array_equal(np.asarray(ours), theirs)
    # the left-padded array itself, with its attention mask, as a HF tokenizer returns it
    encoding = {"input_ids": left, "attention_mask": left_real}
    ours = zoo.generate(no_end, encoding, max_new_tokens=20)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


@pytest.mark.parametrize(
    "variant", ["llama-gqa2-tied-llama3", "mistral-window3", "qwen3-headdim12"]
)
def test_cached_decoding_equals_the_full_forward(variant):
    model = from_hf(make_hf(variant))
    tokens = jnp.asarray(TOKENS[0])
    full = model(tokens)
    extend = eqx.filter_jit(model.extend)
    logits, cache = extend(tokens[:4], model.init_cache(16))  # a prompt, then one at a time
    pieces = [logits]
    for index in range(4, 8):
        logits, cache = extend(tokens[index : index + 1], cache)
        pieces.append(logits)
    assert max_diff(jnp.concatenate(pieces), full) < LOGIT_TOL


def test_to_hf_loads_strictly_in_transformers_with_the_same_logits(run):
    _, hf, model, outputs = run
    state_dict, config = to_hf(model)
    config._attn_implementation = "eager"
    again = getattr(transformers, config.architectures[0])(config).eval()
    again.load_state_dict(state_dict, strict=True)
    assert type(again) is type(hf)
    with torch.no_grad():
        logits = again(tensor(TOKENS), attention_mask=tensor(REAL)).logits.numpy()
    assert max_diff(logits, outputs.logits.numpy(), REAL) < LOGIT_TOL


def hub_folder(hf, folder, *, shards: int, dtype: str):
    """A folder laid out like a hub snapshot: the hub's config spelling, sharded safetensors."""
    config = hf.config.to_dict()
    rope = config.pop("rope_parameters", None) or {}
    config["rope_theta"] = rope.pop("rope_theta", 10000.0)
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = rope
    config.update(torch_dtype=dtype, architectures=[type(hf).__name__], transformers_version="4.45")
    (folder / "config.json").write_text(json.dumps(config))
    arrays = {}
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight" and hf.config.tie_word_embeddings:
            continue
        array = value.float().numpy()
        arrays[name] = array.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else array
    names = sorted(arrays)
    weight_map = {}
    for number in range(shards):
        part = names[number::shards]
        filename = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors({n: arrays[n] for n in part}, folder / filename)
        weight_map.update(dict.fromkeys(part, filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("variant", ["llama-gqa2-tied-llama3", "qwen3-headdim12"])
def test_a_sharded_bf16_hub_folder_loads_as_bf16(tmp_path, variant):
    hf = make_hf(variant)
    hub_folder(hf, tmp_path, shards=3, dtype="bfloat16")
    model = from_pretrained(tmp_path)
    assert model.config.dtype == "bfloat16"
    assert model.embedder.token_weight.dtype == jnp.bfloat16
    # the weights are the checkpoint's bf16 values, bit for bit
    embed = hf.state_dict()["model.embed_tokens.weight"].to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(model.embedder.token_weight, np.float32), embed)
    as_fp32 = from_pretrained(tmp_path, dtype="float32")
    assert as_fp32.embedder.token_weight.dtype == jnp.float32
    # fp32 transformers on the bf16-rounded weights (its rotary buffers stay fp32)
    hf_bf16_weights = make_hf(variant)
    with torch.no_grad():
        for param in hf_bf16_weights.parameters():
            param.copy_(param.to(torch.bfloat16).float())
        reference = hf_bf16_weights(tensor(TOKENS), attention_mask=tensor(REAL)).logits.numpy()
    ours = jax.vmap(as_fp32)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    assert max_diff(ours, reference, REAL) < LOGIT_TOL


def test_bf16_logits_are_no_further_from_fp32_than_transformers_bf16(run):
    variant, _, _, outputs = run
    reference = outputs.logits.numpy().astype(np.float64)
    hf_bf16 = make_hf(variant, dtype=torch.bfloat16)
    with torch.no_grad():
        theirs = hf_bf16(tensor(TOKENS), attention_mask=tensor(REAL)).logits.float().numpy()
    model = from_hf(hf_bf16)
    assert model.config.dtype == "bfloat16"
    ours = np.asarray(
        jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool)).astype(jnp.float32)
    )
    real = REAL.astype(bool)

    def rms(logits):
        return float(np.sqrt(np.mean((logits[real] - reference[real]) ** 2)))

    print(f"\n[bf16] {variant}: zoo rms error {rms(ours):.3g}, transformers {rms(theirs):.3g}")
    assert rms(ours) <= 1.5 * rms(theirs)


def test_save_hf_shards_a_large_model_and_both_libraries_load_it(tmp_path):
    hf = make_hf("qwen2-gqa3-bias-tied")
    model = from_hf(hf)
    save_hf(model, tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (tmp_path / "model.safetensors").exists()
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = again(tensor(TOKENS), attention_mask=tensor(REAL)).logits.numpy()
    ours = jax.vmap(from_pretrained(tmp_path))(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    reference = jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    assert max_diff(theirs, reference, REAL) < LOGIT_TOL
    assert max_diff(ours, reference, REAL) == 0.0


def test_llama3_generation_config_with_several_eos_ids_stops_on_each():
    hf = make_hf("llama-gqa2-tied-llama3")
    config = hf.config.to_dict()
    config.update(eos_token_id=[2, 9, 13], architectures=["LlamaForCausalLM"])
    arrays = {k: v.numpy() for k, v in hf.state_dict().items()}
    model = load_state_dict(config, arrays)
    assert (model.config.eos_id, model.config.stop_ids) == (2, (9, 13))
    assert model.config.end_ids == (2, 9, 13)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "'dynamic' is not implemented"),
        ("hidden_act", "gelu_pytorch_tanh_x", "hidden_act"),
    ],
)
def test_options_that_change_the_computation_are_refused_by_name(field, value, message):
    config = dict(model_type="llama", architectures=["LlamaForCausalLM"], **SMALL)
    config[field] = value
    with pytest.raises(UnsupportedConfig, match=message):
        load_state_dict(config, {})


def test_a_per_layer_sliding_window_is_refused_by_name():
    config = dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=4,
        use_sliding_window=True,
        max_window_layers=2,
        **SMALL,
    )
    with pytest.raises(UnsupportedConfig, match="use_sliding_window.*max_window_layers=2"):
        load_state_dict(config, {})


def test_an_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedConfig, match=r"'falcon'.*llama.*mistral.*qwen2.*qwen3"):
        load_state_dict({"model_type": "falcon"}, {})


def test_a_checkpoint_whose_shapes_do_not_match_its_config_names_the_key():
    hf = make_hf("qwen3-headdim12")
    config = hf.config.to_dict()
    config["architectures"] = ["Qwen3ForCausalLM"]
    arrays = {k: v.numpy() for k, v in hf.state_dict().items()}
    arrays["model.layers.1.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
    with pytest.raises(
        CheckpointMismatch, match=r"layers\.1\.self_attn\.k_proj\.weight.*\(24, 32\)"
    ):
        load_state_dict(config, arrays)


PRESET_CLASSES = {
    "smollm2-135m": ("LlamaForCausalLM", 134_515_008),
    "smollm2-360m": ("LlamaForCausalLM", 361_821_120),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", 494_032_768),
    "qwen3-0.6b": ("Qwen3ForCausalLM", 596_049_920),
    "llama-3.2-1b": ("LlamaForCausalLM", 1_235_814_400),
    "mistral-7b": ("MistralForCausalLM", 7_241_732_096),
}


@pytest.mark.parametrize("name", list(PRESET_CLASSES))
def test_preset_counts_equal_transformers(name):
    check_preset_count(name, *PRESET_CLASSES[name])


def test_the_end_ids_of_generation_config_become_stop_ids(tmp_path):
    hf = make_hf("llama-gqa2-tied-llama3")
    hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 2, 13]}))
    model = from_pretrained(tmp_path)
    assert (model.config.eos_id, model.config.stop_ids) == (2, (9, 13))
