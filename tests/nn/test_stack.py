import equinox as eqx
import jax
import numpy as np

from zoo.nn import BlockInputs, BlockSettings, LayerStack, Mask, TransformerBlock


def make_stack(key, scan):
    return LayerStack(
        lambda k: TransformerBlock(8, BlockSettings.basic(2, 16), key=k), 3, scan=scan, key=key
    )


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
    stack = LayerStack(
        lambda k: TransformerBlock(8, BlockSettings.basic(2, 16, dropout=0.5), key=k), 2, key=key
    )
    x = jax.random.normal(key, (4, 8))
    np.testing.assert_array_equal(stack(x)[0], stack(x)[0])
    a, _ = stack(x, key=jax.random.key(1))
    b, _ = stack(x, key=jax.random.key(2))
    assert not np.allclose(a, b)
    frozen = eqx.nn.inference_mode(stack)
    np.testing.assert_allclose(frozen(x, key=jax.random.key(1))[0], stack(x)[0], atol=1e-6)


def test_remat_changes_neither_outputs_nor_gradients(key):
    """Recomputing in the backward pass is an execution choice: same values, same gradients."""
    import jax.numpy as jnp
    import pytest

    x = jax.random.normal(key, (4, 8))
    mask = Mask(causal=True)

    def loss(stack, x):
        out, _ = stack(x, BlockInputs(mask=mask), key=jax.random.key(3))
        return jnp.sum(jnp.sin(out))

    results = {}
    for remat in (None, "dots", "full"):
        for scan in (True, False):
            stack = LayerStack(
                lambda k: TransformerBlock(8, BlockSettings.basic(2, 16, dropout=0.1), key=k),
                3,
                scan=scan,
                remat=remat,
                key=key,
            )
            results[remat, scan] = eqx.filter_jit(eqx.filter_value_and_grad(loss))(stack, x)
    value, grads = results[None, True]
    for other_value, other_grads in results.values():
        np.testing.assert_allclose(other_value, value, rtol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(other_grads), jax.tree_util.tree_leaves(grads)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="remat must be one of"):
        LayerStack(
            lambda k: TransformerBlock(8, BlockSettings.basic(2, 16), key=k),
            2,
            remat="most",
            key=key,
        )


def test_by_default_layers_are_unrolled_on_a_gpu_and_scanned_elsewhere(key):
    """`scan=None` decides when traced: one scan over the layers on this CPU, three unrolled
    layers when traced for a GPU (`kernel_platform`), the same numbers either way."""
    from zoo.nn import kernel_platform
    from zoo.nn.stack import scans

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
    import jax.numpy as jnp

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

    from zoo.nn import kernel_platform
    from zoo.nn.stack import remat_policy

    stack = LayerStack(
        lambda k: TransformerBlock(8, BlockSettings.basic(2, 16), key=k),
        2,
        scan=True,
        remat="auto",
        key=key,
    )
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
