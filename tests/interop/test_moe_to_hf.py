"""`zoo.to_hf` of every mixture-of-experts family: the in-memory state dict loads strictly into
the transformers model built from the exported config, and computes the same logits."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, max_diff, tensor, torch, transformers

import zoo
from zoo.interop import UnsupportedExport, to_hf
from zoo.interop.architectures import architecture_for
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.plan import LayerOverride

pytestmark = pytest.mark.hf

PRESETS = {
    "mixtral-tiny": "MixtralForCausalLM",
    "qwen2-moe-tiny": "Qwen2MoeForCausalLM",
    "qwen3-moe-tiny": "Qwen3MoeForCausalLM",
    "olmoe-tiny": "OlmoeForCausalLM",
}
TOKENS = np.array([[5, 9, 13, 7, 22, 40, 3, 11, 8, 60], [1, 30, 31, 32, 17, 4, 4, 9, 50, 2]])


def spread(model, seed: int = 0):
    """Every float weight moved by N(0, 0.2): routers that prefer some experts, experts that
    differ, norms near 1 (a fresh init would hide swapped or transposed experts)."""
    leaves, tree = jax.tree_util.tree_flatten(eqx.filter(model, eqx.is_inexact_array))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    moved = [leaf + 0.2 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)]
    return eqx.combine(jax.tree_util.tree_unflatten(tree, moved), model)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_to_hf_loads_strictly_with_the_same_logits(preset):
    model = spread(zoo.create(preset, key=jax.random.key(0)))
    state_dict, config = to_hf(model)
    assert config.architectures == [PRESETS[preset]]
    hf = getattr(transformers, PRESETS[preset])(config)
    hf.load_state_dict(state_dict, strict=True)
    hf.eval()
    with torch.no_grad():
        theirs = hf(tensor(TOKENS)).logits.numpy()
    ours = jax.vmap(model)(jnp.asarray(TOKENS))
    assert max_diff(ours, theirs) < LOGIT_TOL


def test_the_fused_experts_hold_each_expert_gate_rows_first():
    model = spread(zoo.create("olmoe-tiny", key=jax.random.key(0)))
    state_dict, _ = to_hf(model)
    experts = model.layers.blocks.feed_forward.experts
    gate_up = state_dict["model.layers.1.mlp.experts.gate_up_proj"].numpy()
    width = experts.gate.shape[-1]
    np.testing.assert_array_equal(gate_up[3, :width], np.asarray(experts.gate[1, 3]).T)
    np.testing.assert_array_equal(gate_up[3, width:], np.asarray(experts.up[1, 3]).T)
    down = state_dict["model.layers.1.mlp.experts.down_proj"].numpy()
    np.testing.assert_array_equal(down[2], np.asarray(experts.down[1, 2]).T)


def test_dense_layers_export_as_the_largest_sparse_step_and_those_it_misses_listed():
    config = zoo.presets.config("qwen3-moe-mixed-tiny")  # dense layers 0, 2 and 3
    out = architecture_for(config).hf_config(config)
    assert (out["decoder_sparse_step"], out["mlp_only_layers"]) == (2, [3])


def test_layers_a_family_cannot_tell_apart_are_refused_by_name():
    dense = FeedForwardSettings(d_ff=64, kind="gated", activation="silu", bias=False)
    mixtral = zoo.presets.config("mixtral-tiny").replace(
        **{"layers.overrides": (LayerOverride(changes={"feed_forward": dense}, layers=(0,)),)}
    )
    with pytest.raises(UnsupportedExport, match=r"routes every layer; layers \[0\] are dense"):
        architecture_for(mixtral).hf_config(mixtral)
    qwen = zoo.presets.config("qwen3-moe-tiny").replace(
        **{"layers.overrides": (LayerOverride(changes={"attention.window": 4}, layers=(1,)),)}
    )
    with pytest.raises(UnsupportedExport, match="layer 1 differs .* beyond its feed-forward"):
        architecture_for(qwen).hf_config(qwen)
