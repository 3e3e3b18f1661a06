"""OLMo 2 <-> zoo.GPT parity with transformers.

A tiny random `Olmo2ForCausalLM` (norms on the sub-layer outputs, QK-norm over the whole
projections, grouped-query attention, untied head): logits on a padded batch, cached decoding,
export both ways, a sharded bf16 folder with the hub's config.json, and the preset's count.
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

from zoo.interop import UnsupportedConfig, from_hf, from_pretrained, load_state_dict, save_hf, to_hf
from zoo.interop.weights import write_safetensors

pytestmark = pytest.mark.hf

# OLMo-2-0425-1B's config.json as the hub has it, shrunk
HUB_CONFIG = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "model_type": "olmo2",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "vocab_size": 61,
}
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 4, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(seed: int = 0):
    config = hf_transformers.AutoConfig.for_model(**HUB_CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomize(hf_transformers.Olmo2ForCausalLM(config), seed=seed)


def hf_logits(hf) -> np.ndarray:
    with torch.no_grad():
        return hf(tensor(TOKENS), attention_mask=tensor(REAL)).logits.float().numpy()


@eqx.filter_jit
def zoo_logits(model):
    return jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))


@pytest.fixture(scope="module")
def hf():
    return make_hf()


def test_logits_match_and_the_config_says_olmo2(hf):
    model = from_hf(hf)
    block = model.config.layers.block
    qk_norm = block.attention.qk_norm
    assert (block.norm_first, block.output_norm, qk_norm is not None, qk_norm.scope) == (
        False,
        True,
        True,
        "projection",
    )
    assert model.layers.blocks.self_attention.key_norm.weight.shape == (2, 2 * 8)
    diff = max_diff(zoo_logits(model), hf_logits(hf), REAL)
    record("olmo2", diff)
    assert diff < LOGIT_TOL


def test_cached_decoding_equals_the_full_forward(hf):
    model = from_hf(hf)
    tokens = jnp.asarray(TOKENS[0])
    logits, cache = eqx.filter_jit(model.prefill)(tokens[:5], 16)
    pieces, extend = [logits], eqx.filter_jit(model.extend)
    for index in range(5, 8):
        logits, cache = extend(tokens[index : index + 1], cache)
        pieces.append(logits)
    assert max_diff(jnp.concatenate(pieces), model(tokens)) < LOGIT_TOL


def test_export_loads_strictly_in_transformers_and_save_hf_round_trips(hf, tmp_path):
    model = from_hf(hf)
    state_dict, config = to_hf(model)
    config._attn_implementation = "eager"
    again = hf_transformers.Olmo2ForCausalLM(config).eval()
    again.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(again), hf_logits(hf), REAL) < LOGIT_TOL
    save_hf(model, tmp_path)
    loaded = hf_transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(hf)
    assert max_diff(hf_logits(loaded), hf_logits(hf), REAL) < LOGIT_TOL


def test_a_sharded_bf16_hub_folder_loads_as_transformers_reads_it(hf, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    arrays = {k: v.numpy().astype(ml_dtypes.bfloat16) for k, v in hf.state_dict().items()}
    names, weight_map = sorted(arrays), {}
    for number in range(2):
        filename = f"model-{number + 1:05d}-of-00002.safetensors"
        write_safetensors({n: arrays[n] for n in names[number::2]}, tmp_path / filename)
        weight_map.update(dict.fromkeys(names[number::2], filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    model = from_pretrained(tmp_path)
    assert (
        model.config.dtype == "bfloat16"
        and model.config.layers.block.attention.rope.theta == 500000.0
    )
    reference = hf_transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ours = zoo_logits(from_pretrained(tmp_path, dtype="float32"))
    assert max_diff(ours, hf_logits(reference), REAL) < LOGIT_TOL


def test_mlp_biases_are_refused_by_name():
    with pytest.raises(UnsupportedConfig, match="mlp_bias"):
        load_state_dict(dict(HUB_CONFIG, mlp_bias=True), {})


def test_preset_count_equals_transformers():
    check_preset_count("olmo-2-1b", "Olmo2ForCausalLM", 1_484_916_736)
