"""Pytree paths as dotted names, and `fill`: the one way arrays go back into a tree by name."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.tree import fill, named_arrays, path_name, path_parts


class Inner(eqx.Module):
    weight: jax.Array
    scale: float = eqx.field(static=True)


class Outer(eqx.Module):
    blocks: list[Inner]
    table: dict[str, jax.Array]
    bias: jax.Array | None


def tree() -> Outer:
    return Outer(
        blocks=[Inner(jnp.ones((2, 3)), 0.5), Inner(jnp.zeros((2, 3)), 0.5)],
        table={"tokens": jnp.arange(4, dtype=jnp.int32)},
        bias=None,
    )


def test_paths_name_attributes_indices_and_keys():
    flat, _ = jax.tree_util.tree_flatten_with_path(tree())
    assert [path_name(path) for path, _ in flat] == [
        "blocks.0.weight",
        "blocks.1.weight",
        "table.tokens",
    ]
    assert path_parts(flat[1][0]) == ["blocks", "1", "weight"]
    shapes = named_arrays(eqx.filter_eval_shape(tree))  # shapes count as slots too
    assert {name: s.shape for name, s in shapes.items()} == {
        "blocks.0.weight": (2, 3),
        "blocks.1.weight": (2, 3),
        "table.tokens": (4,),
    }


def test_fill_puts_arrays_back_by_name_in_the_slots_dtype():
    skeleton = eqx.filter_eval_shape(tree)
    arrays = {
        "blocks.0.weight": np.full((2, 3), 2.0, np.float64),
        "blocks.1.weight": np.full((2, 3), 3.0, np.float32),
        "table.tokens": np.array([4, 5, 6, 7]),
    }
    filled = fill(skeleton, arrays, "weights.safetensors")
    assert filled.blocks[0].weight.dtype == jnp.float32  # the skeleton's dtype, not float64
    np.testing.assert_array_equal(filled.blocks[1].weight, np.full((2, 3), 3.0))
    np.testing.assert_array_equal(filled.table["tokens"], [4, 5, 6, 7])
    assert filled.table["tokens"].dtype == jnp.int32 and filled.blocks[0].scale == 0.5
    assert filled.bias is None


def test_fill_names_what_is_missing_unexpected_or_misshapen():
    skeleton = tree()
    with pytest.raises(
        ValueError,
        match=r"^f.st: missing arrays \['table.tokens'\], unexpected arrays \['head.weight'\]$",
    ):
        fill(
            skeleton,
            {
                "blocks.0.weight": np.ones((2, 3)),
                "blocks.1.weight": np.ones((2, 3)),
                "head.weight": np.ones(1),
            },
            "f.st",
        )
    with pytest.raises(
        ValueError, match=r"^f.st: array 'blocks.1.weight' has shape \(3, 2\), expected \(2, 3\)$"
    ):
        fill(skeleton, {"blocks.1.weight": np.ones((3, 2))}, "f.st", partial=True)


def test_partial_fill_keeps_the_arrays_not_named():
    filled = fill(tree(), {"blocks.1.weight": np.full((2, 3), 7.0)}, "f.st", partial=True)
    np.testing.assert_array_equal(filled.blocks[0].weight, np.ones((2, 3)))
    np.testing.assert_array_equal(filled.blocks[1].weight, np.full((2, 3), 7.0))
    with pytest.raises(ValueError, match=r"missing arrays \[\], unexpected arrays \['nothing'\]"):
        fill(tree(), {"nothing": np.ones(1)}, "f.st", partial=True)
