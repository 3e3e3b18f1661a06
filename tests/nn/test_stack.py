import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import (
    AttentionSettings,
    BlockInputs,
    BlockSettings,
    FeedForwardSettings,
    LayerIndex,
    LayerOverride,
    LayerPlan,
    LayerStack,
    Mask,
    Rope,
    kernel_platform,
)
from zoo.nn.layer_loop import remat_policy, scans


def small_block(dropout: float = 0.0, **attention: object) -> BlockSettings:
    """2 heads over width 8, a feed-forward of 16."""
    return BlockSettings(
        attention=AttentionSettings(num_heads=2, **attention),  # type: ignore[arg-type]
        feed_forward=FeedForwardSettings(d_ff=16, dropout=dropout),
        dropout=dropout,
    )


def make_stack(key, scan, *, num_layers=3, dropout=0.0, remat=None, overrides=(), **attention):
    plan = LayerPlan(
        block=small_block(dropout, **attention), num_layers=num_layers, overrides=overrides
    )
    return LayerStack(plan, 8, scan=scan, remat=remat, key=key)


def test_scan_equals_unrolled_equals_block_by_block(key):
    scanned, unrolled = make_stack(key, True), make_stack(key, False)
    x = jax.random.normal(key, (4, 8))
    mask = Mask(causal=True)
    out_scan, extras = scanned(x, BlockInputs(mask=mask), return_weights=True)
    out_unrolled, extras_unrolled = unrolled(x, BlockInputs(mask=mask), return_weights=True)
    manual = x
    for i in range(3):
        manual, _ = scanned.layer(i)(manual, BlockInputs(mask=mask))
    np.testing.assert_allclose(out_scan, out_unrolled, atol=1e-6)
    np.testing.assert_allclose(out_scan, manual, atol=1e-6)
    assert extras.self_weights.shape == (3, 2, 4, 4)
    np.testing.assert_allclose(extras.self_weights, extras_unrolled.self_weights, atol=1e-6)


def test_layers_are_initialised_independently(key):
    stack = make_stack(key, True)
    weights = stack.blocks.self_attention.query_proj.weight
    assert weights.shape == (3, 8, 8)
    assert not np.allclose(weights[0], weights[1])


def test_dropout_keys_differ_per_layer_and_no_key_is_deterministic(key):
    stack = make_stack(key, None, num_layers=2, dropout=0.5)
    x = jax.random.normal(key, (4, 8))
    np.testing.assert_array_equal(stack(x)[0], stack(x)[0])
    a, _ = stack(x, key=jax.random.key(1))
    b, _ = stack(x, key=jax.random.key(2))
    assert not np.allclose(a, b)
    frozen = eqx.nn.inference_mode(stack)
    np.testing.assert_allclose(frozen(x, key=jax.random.key(1))[0], stack(x)[0], atol=1e-6)


def test_remat_changes_neither_outputs_nor_gradients(key):
    """Recomputing in the backward pass is an execution choice: same values, same gradients."""
    x = jax.random.normal(key, (4, 8))
    mask = Mask(causal=True)

    def loss(stack, x):
        out, _ = stack(x, BlockInputs(mask=mask), key=jax.random.key(3))
        return jnp.sum(jnp.sin(out))

    results = {}
    for remat in (None, "dots", "full"):
        for scan in (True, False):
            stack = make_stack(key, scan, dropout=0.1, remat=remat)
            results[remat, scan] = eqx.filter_jit(eqx.filter_value_and_grad(loss))(stack, x)
    value, grads = results[None, True]
    for other_value, other_grads in results.values():
        np.testing.assert_allclose(other_value, value, rtol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(other_grads), jax.tree_util.tree_leaves(grads)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="remat must be one of"):
        make_stack(key, None, remat="most")


def test_by_default_layers_are_unrolled_on_a_gpu_and_scanned_elsewhere(key):
    """`scan=None` decides when traced: one scan over the layers on this CPU, three unrolled
    layers when traced for a GPU (`kernel_platform`), the same numbers either way."""
    stack = make_stack(key, None)
    x = jax.random.normal(key, (4, 8))

    def primitives(platform):
        with kernel_platform(platform):
            assert scans(None) == (platform == "cpu")
            jaxpr = eqx.filter_make_jaxpr(
                lambda s, x: s(x, BlockInputs(mask=Mask(causal=True)))[0]
            )(stack, x)[0]
        return [equation.primitive.name for equation in jaxpr.jaxpr.eqns]

    assert primitives("cpu").count("scan") == 1
    assert "scan" not in primitives("gpu")
    with kernel_platform("gpu"):
        unrolled = stack(x, BlockInputs(mask=Mask(causal=True)))[0]
    np.testing.assert_allclose(
        unrolled, stack(x, BlockInputs(mask=Mask(causal=True)))[0], atol=1e-6
    )
    assert scans(True) and not scans(False)


def test_unrolled_decoding_updates_the_stacked_cache_like_the_scan(key):
    """Three positions fed one at a time through the cache: scanned and unrolled stacks write
    the same cache and give the same outputs as attending over all three at once."""
    x = jax.random.normal(key, (3, 8))
    full, _ = make_stack(key, True)(x, BlockInputs(mask=Mask(causal=True)))
    for scan in (True, False):
        stack = make_stack(key, scan)
        cache = stack.init_cache(4)
        outputs = []
        for index in range(3):
            mask = Mask(causal=True, offset=jnp.asarray(index)).limit_keys(index + 1)
            out, extras = stack(x[index : index + 1], BlockInputs(mask=mask, cache=cache))
            cache = extras.cache.advance(1)
            outputs.append(out)
        np.testing.assert_allclose(jnp.concatenate(outputs), full, atol=1e-5)
        assert cache.keys.shape == (3, 4, 2, 4)
        assert np.all(np.asarray(cache.keys[:, 3]) == 0)  # the fourth slot was never written


def test_auto_remat_recomputes_elementwise_work_on_a_cpu_only(key):
    """`remat="auto"`: the layers run under `jax.checkpoint` with the "dots" policy when traced
    for a CPU, and without one when traced for a GPU."""
    import re

    stack = make_stack(key, True, num_layers=2, remat="auto")
    x = jax.random.normal(key, (4, 8))

    def checkpoints(platform):
        with kernel_platform(platform):
            jaxpr = eqx.filter_make_jaxpr(
                lambda s: s(x, BlockInputs(mask=Mask(causal=True)))[0].sum()
            )(stack)[0]
        return len(re.findall(r"\b(checkpoint|remat2?)\[", str(jaxpr)))

    assert checkpoints("cpu") == 1 and checkpoints("gpu") == 0
    with kernel_platform("gpu"):
        assert remat_policy("auto") is None
    with kernel_platform("cpu"):
        assert remat_policy("auto") == "dots" and remat_policy("full") == "full"


# -- layers that differ in their call: a window and a rotary base by layer ----------------------

LOCAL_GLOBAL = (
    LayerOverride(
        changes={"attention.window": None, "attention.rope": Rope(theta=1000.0)}, start=1, step=2
    ),
)


@pytest.mark.parametrize("scan", [True, False])
def test_layers_that_differ_in_their_call_share_weights_and_run_as_their_settings_say(key, scan):
    """Layers 0 and 2 see the last 2 positions and rotate by base 10000, layer 1 sees every
    position and rotates by base 1000: one stacked group, each layer as a block of its own
    settings would run it, scanned (`lax.switch` between the calls) or unrolled."""
    stack = make_stack(key, scan, overrides=LOCAL_GLOBAL, rope=Rope(), window=2)
    assert isinstance(stack.blocks, eqx.Module) and stack.group_of == (0, 0, 0)
    assert [stack.calls[c] for c in stack.call_of] == [
        (2, Rope()),
        (None, Rope(theta=1000.0)),
        (2, Rope()),
    ]
    x = jax.random.normal(key, (6, 8))
    out, extras = stack(x, BlockInputs(mask=Mask(causal=True)), return_weights=True)
    manual = x
    for i in range(3):
        manual, _ = stack.layer(i)(manual, BlockInputs(mask=Mask(causal=True)))
    np.testing.assert_allclose(out, manual, atol=1e-5)
    weights = np.asarray(extras.self_weights)
    assert np.all(weights[0][:, 5, :4] == 0) and np.all(weights[1][:, 5, :4] > 0)
    plain = make_stack(key, scan, rope=Rope(), window=2)
    assert not np.allclose(plain(x, BlockInputs(mask=Mask(causal=True)))[0], out)


def test_layers_without_rotary_positions_among_rotary_ones(key):
    """A layer whose override takes its rotary positions away (SmolLM3's NoPE layers) runs as a
    block without rotary: a new family's difference is a layer override, not a config field."""
    no_rope = (LayerOverride(changes={"attention.rope": None}, start=3, step=4),)
    stack = make_stack(key, True, num_layers=4, overrides=no_rope, rope=Rope())
    assert [stack.calls[c].rope for c in stack.call_of] == [Rope(), Rope(), Rope(), None]
    assert stack.layer(3).self_attention.rotary is None
    x = jax.random.normal(key, (5, 8))
    out, _ = stack(x, BlockInputs(mask=Mask(causal=True)))
    manual = x
    for i in range(4):
        manual, _ = stack.layer(i)(manual, BlockInputs(mask=Mask(causal=True)))
    np.testing.assert_allclose(out, manual, atol=1e-5)


def test_layers_of_other_weights_go_in_groups_whose_rows_the_index_names(key):
    """A dense layer among gated ones: two groups (`blocks.0`, `blocks.1`), run in layer order,
    and `LayerIndex` names each row by its layer number."""
    dense = FeedForwardSettings(d_ff=4)
    overrides = (LayerOverride(changes={"feed_forward": dense}, layers=(1,)),)
    stack = make_stack(key, True, overrides=overrides)
    assert stack.group_of == (0, 1, 0) and len(stack.groups) == 2
    assert stack.groups[1].feed_forward.hidden.weight.shape == (1, 4, 8)
    x = jax.random.normal(key, (4, 8))
    out, _ = stack(x, BlockInputs(mask=Mask(causal=True)))
    manual = x
    for i in range(3):
        manual, _ = stack.layer(i)(manual, BlockInputs(mask=Mask(causal=True)))
    np.testing.assert_allclose(out, manual, atol=1e-5)
    index = LayerIndex({"encoder": stack})
    assert index.layer_names("encoder.blocks.0.feed_forward.hidden.weight") == [
        ("encoder.0.feed_forward.hidden.weight", 0),
        ("encoder.2.feed_forward.hidden.weight", 1),
    ]
    assert index.layer_names("encoder.blocks.1.feed_forward.hidden.weight") == [
        ("encoder.1.feed_forward.hidden.weight", 0)
    ]
    assert index.layer_names("embedder.token_weight") is None
