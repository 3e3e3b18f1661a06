"""Every part that draws weights takes one `Init` (std and dtype); the loose `init_std=` and
`dtype=` keywords of 0.1 are refused."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import Init, Linear, MaskedLMHead, RelativePositionBias


def test_linear_draws_its_weight_as_init_says(key):
    layer = Linear(64, 32, init=Init(0.5, jnp.bfloat16), key=key)
    assert layer.weight.dtype == jnp.bfloat16 and layer.bias is not None
    assert layer.bias.dtype == jnp.bfloat16
    assert 0.45 < float(jnp.std(layer.weight.astype(jnp.float32))) < 0.55
    np.testing.assert_array_equal(layer.bias, 0)
    assert eqx.tree_equal(Init(0.5, jnp.bfloat16).linear(64, 32, key=key), layer)
    assert Linear(4, 2, use_bias=False, key=key).weight.dtype == jnp.float32  # Init()


@pytest.mark.parametrize(
    "build",
    [
        lambda key, **init: Linear(8, 4, key=key, **init),
        lambda key, **init: MaskedLMHead(8, 11, key=key, **init),
        lambda key, **init: RelativePositionBias(2, bidirectional=True, key=key, **init),
    ],
    ids=["Linear", "MaskedLMHead", "RelativePositionBias"],
)
def test_every_part_draws_as_its_init_says(build, key):
    new = build(key, init=Init(0.3, jnp.float16))
    leaves = jax.tree_util.tree_leaves(eqx.filter(new, eqx.is_array))
    assert leaves and all(leaf.dtype == jnp.float16 for leaf in leaves)
    assert eqx.tree_equal(new, build(key, init=Init(0.3, jnp.float16)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'init_std'"):
        build(key, init_std=0.3)
