"""Phi-3 / Phi-3.5 / Phi-4-mini <-> zoo.GPT parity with transformers.

Tiny random `Phi3ForCausalLM`s: plain rotary with a window (Phi-3-mini-4k's shape), and
LongRoPE with partial rotary and grouped-query attention (Phi-4-mini's parts) on sequences
within and beyond `original_max_position_embeddings`. The fused `qkv_proj` and `gate_up_proj`
split on load and fuse again on export; greedy generation crosses the LongRoPE switch as
transformers does; a sharded bf16 folder with the hub's config.json loads; preset counts.
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, check_preset_count, max_diff, randomize, record, tensor, torch
from hf_helpers import transformers as hf_transformers

import zoo
from zoo.interop import UnsupportedConfig, from_hf, from_pretrained, load_state_dict, save_hf, to_hf
from zoo.interop.weights import write_safetensors

pytestmark = pytest.mark.hf

LONGROPE = {
    "type": "longrope",  # the hub's spelling
    "short_factor": [1.0, 1.5, 2.0],
    "long_factor": [2.0, 4.0, 8.0],
}
# Phi-4-mini-instruct's config.json, shrunk: 3/4 of each 8-wide head rotates (3 frequencies)
HUB_CONFIG = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 2,
    "full_attn_mod": 1,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "interpolate_factor": 1,
    "lm_head_bias": False,
    "max_position_embeddings": 64,
    "mlp_bias": False,
    "model_type": "phi3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "original_max_position_embeddings": 6,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.75,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": LONGROPE,
    "rope_theta": 10000.0,
    "sliding_window": 262144,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0",
    "use_cache": True,
    "vocab_size": 61,
}
PLAIN = dict(HUB_CONFIG, rope_scaling=None, partial_rotary_factor=1.0, sliding_window=3)
PLAIN.update(tie_word_embeddings=False, original_max_position_embeddings=64)
VARIANTS = {"longrope-partial-gqa-tied": HUB_CONFIG, "plain-window3-untied": PLAIN}
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 4, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(variant: str, seed: int = 0):
    config = hf_transformers.AutoConfig.for_model(**VARIANTS[variant])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomize(hf_transformers.Phi3ForCausalLM(config), seed=seed)


def hf_logits(hf, tokens, real) -> np.ndarray:
    with torch.no_grad():
        return hf(tensor(tokens), attention_mask=tensor(real)).logits.float().numpy()


@eqx.filter_jit
def zoo_logits(model, tokens, real):
    return jax.vmap(model)(jnp.asarray(tokens), jnp.asarray(real, bool))


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    hf = make_hf(request.param)
    return request.param, hf, from_hf(hf)


# transformers picks LongRoPE's factors from the batch's longest positions, zoo per example:
# the batches here are all within (5 tokens) or all beyond (8 tokens) the original 6
@pytest.mark.parametrize("width", [5, 8])
def test_logits_match_within_and_beyond_the_original_context(run, width):
    variant, hf, model = run
    tokens, real = TOKENS[:, :width], np.ones_like(TOKENS[:, :width])
    diff = max_diff(zoo_logits(model, tokens, real), hf_logits(hf, tokens, real), real)
    record(f"phi3 {variant}", diff)
    assert diff < LOGIT_TOL


def test_a_padded_batch_matches(run):
    variant, hf, model = run
    if variant.startswith("longrope"):
        pytest.skip("transformers' LongRoPE switch is per batch; zoo's per example")
    assert max_diff(zoo_logits(model, TOKENS, REAL), hf_logits(hf, TOKENS, REAL), REAL) < LOGIT_TOL


def test_the_zoo_config_reads_longrope_and_partial_rotary():
    c = from_hf(make_hf("longrope-partial-gqa-tied")).config
    rope = c.layers.block.attention.rope
    assert (rope.scaling, rope.short_factor, rope.long_factor) == (
        "longrope",
        (1.0, 1.5, 2.0),
        (2.0, 4.0, 8.0),
    )
    assert (rope.original_max_positions, rope.factor, rope.partial_rotary_factor) == (
        6,
        64 / 6,
        0.75,
    )
    assert rope.rotary_dim(c.head_dim) == 6 and c.layers.block.attention.window == 262144


def test_the_fused_projections_split_into_zoo_layers(run):
    _, hf, model = run
    state = hf.state_dict()
    qkv = state["model.layers.1.self_attn.qkv_proj.weight"].numpy()
    attention = model.layers.layer(1).self_attention
    np.testing.assert_array_equal(np.asarray(attention.query_proj.weight), qkv[:32])
    np.testing.assert_array_equal(np.asarray(attention.key_proj.weight), qkv[32:48])
    np.testing.assert_array_equal(np.asarray(attention.value_proj.weight), qkv[48:])
    gate_up = state["model.layers.1.mlp.gate_up_proj.weight"].numpy()
    feed_forward = model.layers.layer(1).feed_forward
    np.testing.assert_array_equal(np.asarray(feed_forward.gate.weight), gate_up[:48])
    np.testing.assert_array_equal(np.asarray(feed_forward.hidden.weight), gate_up[48:])


def test_greedy_generation_past_the_original_context_matches_transformers():
    """A prompt already past `original_max_position_embeddings`: every position rotates by the
    long factors on both sides. (When a generation crosses it, transformers re-encodes the
    prefix once with the long factors; zoo's cache keeps the keys it has.)"""
    hf = make_hf("longrope-partial-gqa-tied")
    prompt = [[5, 17, 3, 44, 8, 21, 9]]
    with torch.no_grad():
        theirs = hf.generate(
            tensor(prompt), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )[:, 7:].numpy()
    ours = zoo.generate(from_hf(hf, eos_id=None), prompt, max_new_tokens=8)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_cached_decoding_across_the_switch_equals_transformers_step_by_step():
    hf = make_hf("longrope-partial-gqa-tied")
    model = from_hf(hf)
    tokens = [5, 17, 3, 44, 12, 12, 39, 12, 12]  # positions 0..8, the original context is 6
    cache = hf_transformers.DynamicCache(config=hf.config)
    with torch.no_grad():
        theirs = [hf(tensor([tokens[:4]]), cache=cache).logits[0].numpy()]
        for index in range(4, len(tokens)):
            step = hf(tensor([[tokens[index]]]), cache=cache, position_ids=tensor([[index]]))
            theirs.append(step.logits[0].numpy())
    logits, zoo_cache = eqx.filter_jit(model.prefill)(jnp.asarray(tokens[:4]), 16)
    ours, extend = [logits], eqx.filter_jit(model.extend)
    for index in range(4, len(tokens)):
        logits, zoo_cache = extend(jnp.asarray(tokens[index : index + 1]), zoo_cache)
        ours.append(logits)
    assert max_diff(np.concatenate(ours), np.concatenate(theirs)) < LOGIT_TOL


def test_export_fuses_again_and_loads_strictly_in_transformers(tmp_path):
    hf = make_hf("longrope-partial-gqa-tied")
    model = from_hf(hf)
    state_dict, config = to_hf(model)
    assert config.architectures == ["Phi3ForCausalLM"]
    assert "model.layers.0.self_attn.qkv_proj.weight" in state_dict
    config._attn_implementation = "eager"
    again = hf_transformers.Phi3ForCausalLM(config).eval()
    again.load_state_dict(state_dict, strict=True)
    tokens, real = TOKENS[:1], REAL[:1]
    assert max_diff(hf_logits(again, tokens, real), hf_logits(hf, tokens, real)) < LOGIT_TOL
    save_hf(model, tmp_path)
    loaded = hf_transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(loaded, tokens, real), hf_logits(hf, tokens, real)) < LOGIT_TOL


def test_a_sharded_bf16_hub_folder_loads_as_transformers_reads_it(tmp_path):
    hf = make_hf("longrope-partial-gqa-tied", seed=1)
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    arrays = {
        k: v.numpy().astype(ml_dtypes.bfloat16)
        for k, v in hf.state_dict().items()
        if k != "lm_head.weight"
    }
    names, weight_map = sorted(arrays), {}
    for number in range(2):
        filename = f"model-{number + 1:05d}-of-00002.safetensors"
        write_safetensors({n: arrays[n] for n in names[number::2]}, tmp_path / filename)
        weight_map.update(dict.fromkeys(names[number::2], filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert from_pretrained(tmp_path).config.dtype == "bfloat16"
    reference = hf_transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ours = zoo_logits(from_pretrained(tmp_path, dtype="float32"), TOKENS[:1], REAL[:1])
    assert max_diff(ours, hf_logits(reference, TOKENS[:1], REAL[:1])) < LOGIT_TOL


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_scaling"),
        ("rope_scaling", dict(LONGROPE, long_factor=[1.0, 2.0]), "rope_scaling"),
        ("hidden_act", "gelu_pytorch_tanh_x", "hidden_act"),
    ],
)
def test_options_that_change_the_computation_are_refused_by_name(field, value, message):
    with pytest.raises(UnsupportedConfig, match=message):
        load_state_dict(dict(HUB_CONFIG, **{field: value}), {})


PRESETS = {
    "phi-3-mini-4k": ("MistralForCausalLM", 3_821_079_552),  # no LongRoPE: Mistral's network
    "phi-3.5-mini": ("Phi3ForCausalLM", 3_821_079_552),
    "phi-4-mini": ("Phi3ForCausalLM", 3_836_021_760),
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_counts_equal_transformers(name):
    check_preset_count(name, *PRESETS[name])
