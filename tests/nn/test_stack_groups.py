"""A stack of two kinds of layer (two feed-forward widths): a group per kind, applied in layer
order, scanned or unrolled, with local and global layers and a KV cache across the groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.models import GPTConfig
from zoo.models.flat import config_from_flat
from zoo.nn import (
    AttentionSettings,
    BlockInputs,
    BlockSettings,
    LayerOverride,
    LayerPlan,
    LayerStack,
    Mask,
    MoESettings,
)
from zoo.nn.feedforward import FeedForwardSettings

WIDE = (1, 2, 4)  # layers of width 24; the others 16
CAUSAL = Mask(causal=True)


def make_stack(
    scan: bool, *, global_layers: tuple[int, ...] = (), remat: str | None = None
) -> LayerStack:
    """Five layers of two widths; each sees the last 2 positions but the `global_layers`."""
    narrow = BlockSettings(
        attention=AttentionSettings(num_heads=2, window=2),
        feed_forward=FeedForwardSettings(d_ff=16),
    )
    overrides = [LayerOverride(changes={"feed_forward": FeedForwardSettings(d_ff=24)}, layers=WIDE)]
    if global_layers:
        overrides.append(LayerOverride(changes={"attention.window": None}, layers=global_layers))
    plan = LayerPlan(block=narrow, num_layers=5, overrides=tuple(overrides))
    return LayerStack(plan, 8, scan=scan, remat=remat, key=jax.random.key(0))


def by_hand(stack: LayerStack, x):
    """Each layer as a standalone block, called as that layer (its window or none)."""
    weights = []
    for index in range(stack.num_layers):
        x, extras = stack.layer(index)(x, BlockInputs(mask=CAUSAL), return_weights=True)
        weights.append(extras.self_weights)
    return x, np.stack(weights)


def test_groups_hold_the_layers_of_their_kind():
    stack = make_stack(True)
    assert isinstance(stack.blocks, tuple)
    assert stack.group_layers(0) == (0, 3) and stack.group_layers(1) == (1, 2, 4)
    assert stack.groups[0].feed_forward.hidden.weight.shape == (2, 16, 8)
    assert stack.groups[1].feed_forward.hidden.weight.shape == (3, 24, 8)
    assert [(r.group, r.row, r.start, r.stop) for r in stack.runs()] == [
        (0, 0, 0, 1),
        (1, 0, 1, 3),
        (0, 1, 3, 4),
        (1, 2, 4, 5),
    ]
    assert stack.layer(3).feed_forward.hidden.weight.shape == (16, 8)


@pytest.mark.parametrize("scan", [True, False])
def test_layers_run_in_order_with_their_pattern(scan):
    x = jax.random.normal(jax.random.key(1), (5, 8))
    stack = make_stack(scan, global_layers=(2, 3))
    assert stack.layer(2).self_attention.window is None and stack.layer(1).self_attention.window
    out, extras = stack(x, BlockInputs(mask=CAUSAL), return_weights=True)
    expected, weights = by_hand(stack, x)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(extras.self_weights, weights, atol=1e-6)  # in layer order


@pytest.mark.parametrize("scan", [True, False])
def test_cached_decoding_across_groups_equals_the_full_pass(scan):
    x = jax.random.normal(jax.random.key(2), (6, 8))
    stack = make_stack(scan, global_layers=(1,))
    full, _ = stack(x, BlockInputs(mask=CAUSAL))
    cache = stack.init_cache(8)
    prefix, extras = stack(x[:4], BlockInputs(mask=CAUSAL, cache=cache))
    cache = extras.cache.advance(4)
    steps = [prefix]
    for position in (4, 5):
        mask = Mask(causal=True, offset=jnp.asarray(position))
        step, extras = stack(x[position : position + 1], BlockInputs(mask=mask, cache=cache))
        cache = extras.cache.advance(1)
        steps.append(step)
    np.testing.assert_allclose(jnp.concatenate(steps), full, atol=1e-5)
    assert int(cache.index) == 6


def test_the_dense_layers_of_a_0_1_config_are_overrides_of_the_plan():
    """0.1's three ways of making layers dense among experts read as a plan's overrides."""

    def routed(**fields):
        base = dict(num_layers=4, num_experts=4, d_model=16, num_heads=2, vocab_size=32)
        plan = config_from_flat(GPTConfig, {**base, **fields}).layers
        return tuple(isinstance(s.feed_forward, MoESettings) for s in plan.layers())

    assert routed(decoder_sparse_step=2) == (False, True, False, True)
    assert routed(mlp_only_layers=(0, 2)) == (False, True, False, True)
    assert routed(first_k_dense_replace=1) == (False, True, True, True)
    assert routed() == (True, True, True, True)


def test_partition_rules_match_the_groups_paths():
    """A mixed stack's paths (`layers.blocks.<group>.`) keep the rules' suffixes: the dense
    group's feed-forward splits like a dense model's, the sparse group's experts by expert."""
    import zoo
    from zoo.distributed import abstract_mesh, sharding_table

    model = eqx.filter_eval_shape(lambda: zoo.create("qwen3-moe-mixed-tiny", key=jax.random.key(0)))
    mesh = abstract_mesh("data=1,fsdp=2,tensor=2,expert=2", 8)
    table = {row["name"]: row["spec"] for row in sharding_table(model, mesh)}
    dense, sparse = "layers.blocks.0.feed_forward.", "layers.blocks.1.feed_forward."
    assert table[dense + "gate.weight"] == jax.sharding.PartitionSpec(None, "tensor", "fsdp")
    assert table[dense + "output.weight"] == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert table[sparse + "experts.gate"] == jax.sharding.PartitionSpec(
        None, "expert", "fsdp", "tensor"
    )
    assert table["layers.blocks.1.self_attention.query_proj.weight"] == (
        jax.sharding.PartitionSpec(None, "tensor", "fsdp")
    )


def test_remat_across_groups_keeps_the_gradients():
    # in a fresh process: in a test worker that had run many other tests first, XLA's CPU
    # compiler crashed (SIGSEGV) compiling this program; alone it compiles and passes
    code = "from tests.nn.test_stack_groups import check_remat_gradients; check_remat_gradients()"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def check_remat_gradients():
    """Recomputing whole layers changes no gradient, across the groups of a stack."""
    x = jax.random.normal(jax.random.key(3), (4, 8))

    def gradients(stack):
        def loss(stack):
            return jnp.sum(jnp.sin(stack(x, BlockInputs(mask=CAUSAL))[0]))

        return eqx.filter_jit(eqx.filter_grad(loss))(stack)

    plain, recomputed = gradients(make_stack(True)), gradients(make_stack(True, remat="full"))
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(recomputed)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert float(jnp.abs(plain.groups[0].feed_forward.hidden.weight[1]).max()) > 0  # layer 3
