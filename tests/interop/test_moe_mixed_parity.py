"""Qwen2-MoE and Qwen3-MoE with dense layers among the sparse ones (`mlp_only_layers`,
`decoder_sparse_step`) <-> a zoo.GPT whose stack holds a dense group and a sparse group.

Tiny random transformers models of 4 layers: fp32 logits (1e-4) through `save_pretrained`
folders, the load-balancing loss over the sparse layers, the export loaded back by
transformers, parameter counts, and greedy decoding with the KV cache against the full forward.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, max_diff, randomize, record, tensor, torch, transformers

import zoo
from zoo.interop import from_pretrained, save_hf
from zoo.nn.moe import MoESettings, router_losses
from zoo.presets import count_params

pytestmark = pytest.mark.hf

SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    router_aux_loss_coef=0.02,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)
CASES = {
    # (class, config class, fields, the layers that route)
    "qwen2_moe-step2": (
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        dict(decoder_sparse_step=2, shared_expert_intermediate_size=36),
        (False, True, False, True),
    ),
    "qwen3_moe-mlp-only": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(mlp_only_layers=[0, 3], head_dim=12, norm_topk_prob=True),
        (False, True, True, False),
    ),
    "qwen3_moe-both": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(decoder_sparse_step=2, mlp_only_layers=[3], head_dim=12),
        (False, True, False, False),
    ),
}
TOKENS = np.array([[5, 9, 13, 7, 22, 40, 3, 11, 8, 60], [1, 30, 31, 32, 17, 4, 4, 9, 50, 2]])


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    """(case, transformers model, zoo model from its save_pretrained folder, outputs)."""
    class_name, config_name, fields, _ = CASES[request.param]
    config = getattr(transformers, config_name)(**{**SMALL, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, class_name)(config), std=0.3)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    with torch.no_grad():
        outputs = hf(tensor(TOKENS), output_router_logits=True)
    return request.param, hf, from_pretrained(folder, eos_id=None), outputs


def test_dense_layers_are_a_group_of_their_own(run):
    case, hf, model, _ = run
    routed = CASES[case][3]
    layers = model.config.layers.layers()
    assert tuple(isinstance(s.feed_forward, MoESettings) for s in layers) == routed
    stack = model.layers
    assert len(stack.groups) == 2
    for index, routes in enumerate(routed):
        feed_forward = stack.layer(index).feed_forward
        assert hasattr(feed_forward, "router") == routes
        if not routes:  # Qwen's dense MLP is intermediate_size wide
            assert feed_forward.gate.weight.shape == (40, 32)
    assert count_params(model) == hf.num_parameters()


def test_logits_match_transformers(run):
    case, _, model, outputs = run
    diff = max_diff(jax.vmap(model)(jnp.asarray(TOKENS)), outputs.logits.numpy())
    record(case, diff)
    assert diff < LOGIT_TOL


def test_load_balancing_loss_over_the_sparse_layers_matches(run):
    _, _, model, outputs = run
    _, router = jax.vmap(model.features_and_router)(jnp.asarray(TOKENS))
    balance, _ = router_losses(router)
    np.testing.assert_allclose(balance, outputs.aux_loss.item(), rtol=1e-5)


def test_export_loads_in_transformers_with_the_same_logits(run, tmp_path):
    _, hf, model, outputs = run
    save_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for name in ("mlp_only_layers", "decoder_sparse_step"):
        assert config[name] == getattr(hf.config, name)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert set(again.state_dict()) == set(hf.state_dict())
    with torch.no_grad():
        logits = again(tensor(TOKENS)).logits.numpy()
    assert max_diff(logits, outputs.logits.numpy()) < LOGIT_TOL


def test_greedy_decoding_with_the_cache_equals_the_full_forward(run):
    case, _, model, _ = run
    if case != "qwen2_moe-step2":  # one case: dense, sparse, dense, sparse runs
        pytest.skip("the alternating stack covers the cache across groups")
    prompts = jnp.asarray(TOKENS[:, :5], jnp.int32)
    ours = np.asarray(zoo.generate(model, prompts, max_new_tokens=4))
    # no cache: one causal pass over prompt + continuation; greedy means each new token is the
    # argmax of the logits at the position before it
    logits = jax.vmap(model)(jnp.concatenate([prompts, jnp.asarray(ours)], axis=1))
    np.testing.assert_array_equal(ours, np.argmax(logits[:, 4:8], -1))
