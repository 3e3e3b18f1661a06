"""Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE <-> a mixture-of-experts zoo.GPT, against transformers.

Tiny random models of each family: logits (fp32, 1e-4) through `save_pretrained` folders and
from the in-memory model, the load-balancing loss against transformers' `aux_loss`, export
back to transformers, a sharded bf16 hub folder, and the presets' total and active parameter
counts against transformers models built on the meta device.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, max_diff, randomize, record, tensor, torch, transformers

import zoo
from zoo.interop import from_hf, from_pretrained, save_hf
from zoo.interop.weights import read_safetensors, write_safetensors
from zoo.nn.moe import router_losses
from zoo.presets.moe import active_param_count

pytestmark = pytest.mark.hf

SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.02,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)
FAMILIES = {
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4)),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(num_experts=4, moe_intermediate_size=24, head_dim=12, norm_topk_prob=True),
    ),
    "qwen2_moe": (
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        dict(num_experts=4, moe_intermediate_size=24, shared_expert_intermediate_size=36),
    ),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(num_experts=4)),
}
TOKENS = np.array([[5, 9, 13, 7, 22, 40, 3, 11, 8, 60], [1, 30, 31, 32, 17, 4, 4, 9, 50, 2]])


def make_hf(family: str):
    class_name, config_name, fields = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SMALL, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(getattr(transformers, class_name)(config), std=0.3)


@pytest.fixture(scope="module", params=list(FAMILIES))
def run(request, tmp_path_factory):
    """(family, transformers model, zoo model loaded from its save_pretrained folder, outputs)."""
    hf = make_hf(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    with torch.no_grad():
        outputs = hf(tensor(TOKENS), output_router_logits=True)
    return request.param, hf, from_pretrained(folder), outputs


def test_logits_match_transformers(run):
    family, _, model, outputs = run
    ours = jax.vmap(model)(jnp.asarray(TOKENS))
    diff = max_diff(ours, outputs.logits.numpy())
    record(family, diff)
    assert diff < LOGIT_TOL


def test_load_balancing_loss_matches_transformers_aux_loss(run):
    _, hf, model, outputs = run
    assert model.config.experts().aux_loss_coef == hf.config.router_aux_loss_coef
    _, router = jax.vmap(model.features_and_router)(jnp.asarray(TOKENS))
    balance, _ = router_losses(router)
    np.testing.assert_allclose(balance, outputs.aux_loss.item(), rtol=1e-5)


def test_the_in_memory_fused_experts_load_too(run):
    _, hf, model, _ = run
    again = from_hf(hf)
    np.testing.assert_array_equal(
        again.layers.blocks.feed_forward.experts.gate, model.layers.blocks.feed_forward.experts.gate
    )


def test_export_loads_in_transformers_with_the_same_logits(run, tmp_path):
    family, hf, model, outputs = run
    save_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == family
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert type(again) is type(hf)
    with torch.no_grad():
        logits = again(tensor(TOKENS)).logits.numpy()
    assert max_diff(logits, outputs.logits.numpy()) < LOGIT_TOL


def test_a_sharded_bf16_hub_folder_stacks_the_per_expert_keys(tmp_path):
    hf = make_hf("mixtral")
    hf.save_pretrained(tmp_path / "saved")
    arrays = read_safetensors(tmp_path / "saved" / "model.safetensors")
    assert "model.layers.1.block_sparse_moe.experts.3.w1.weight" in arrays  # the hub's names
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "config.json").write_text((tmp_path / "saved" / "config.json").read_text())
    names = sorted(arrays)
    weight_map = {}
    for number in range(3):
        filename = f"model-{number + 1:05d}-of-00003.safetensors"
        part = {
            n: np.asarray(arrays[n], np.float32).astype(ml_dtypes.bfloat16)
            for n in names[number::3]
        }
        write_safetensors(part, hub / filename)
        weight_map.update(dict.fromkeys(part, filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (hub / "model.safetensors.index.json").write_text(json.dumps(index))
    model = from_pretrained(hub)
    assert model.config.dtype == "bfloat16"
    w1 = np.asarray(arrays["model.layers.1.block_sparse_moe.experts.3.w1.weight"], np.float32)
    stacked = np.asarray(model.layers.blocks.feed_forward.experts.gate[1, 3], np.float32)
    np.testing.assert_array_equal(stacked, w1.astype(ml_dtypes.bfloat16).astype(np.float32).T)


def active_count(hf) -> int:
    """Parameters one token uses: all but the experts it is not routed to."""
    config = hf.config
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    expert_params = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    share = config.num_experts_per_tok / experts
    return hf.num_parameters() - expert_params + round(expert_params * share)


@pytest.mark.parametrize(
    ("preset", "total", "active"),
    [
        ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
        ("qwen3-30b-a3b", 30_532_122_624, 3_353_032_704),
        ("qwen2-moe-a2.7b", 14_315_784_192, 2_689_173_504),
        ("olmoe-1b-7b", 6_919_161_856, 1_282_017_280),
    ],
)
def test_preset_counts_equal_transformers_total_and_active(preset, total, active):
    config = zoo.presets.config(preset)
    from zoo.interop.architectures import architecture_for

    arch = architecture_for(config)
    fields = {k: v for k, v in arch.hf_config(config).items() if k != "model_type"}
    with torch.device("meta"):
        hf = getattr(transformers, fields["architectures"][0])(
            getattr(transformers, arch.config_class)(**fields)
        )
    assert zoo.presets.param_count(preset) == hf.num_parameters() == total
    assert active_param_count(config) == active_count(hf) == active


def test_greedy_generation_with_the_kv_cache_matches_transformers():
    hf = make_hf("qwen3_moe")
    prompts = np.array([[5, 17, 3, 44, 8, 21], [12, 7, 33, 9, 9, 40]])
    with torch.no_grad():
        theirs = hf.generate(
            tensor(prompts), max_new_tokens=12, do_sample=False, eos_token_id=None
        )[:, prompts.shape[1] :].numpy()
    model = from_hf(hf, eos_id=None)  # all 12 steps on both sides
    ours = zoo.generate(model, jnp.asarray(prompts, jnp.int32), max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(ours), theirs)
