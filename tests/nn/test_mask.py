"""The mask value: its array by hand, what it tells the fused kernels, and compaction."""

import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import Compaction, Mask


def test_arrays_by_hand():
    causal_pad = Mask(causal=True, key_length=jnp.array(2)).array(3, 3)
    np.testing.assert_array_equal(causal_pad, [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    padding = Mask(key_length=jnp.array(2)).array(2, 3)
    np.testing.assert_array_equal(padding, [[1, 1, 0], [1, 1, 0]])
    # two positions cached on a 4-slot cache: the queries sit at positions 2 and 3
    offset = Mask(causal=True, offset=jnp.array(2)).array(2, 4)
    np.testing.assert_array_equal(offset, [[1, 1, 1, 0], [1, 1, 1, 1]])
    # a window of 2: each query sees itself and the key before it
    window = Mask(causal=True, window=2).array(4, 4)
    np.testing.assert_array_equal(window, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    queries = Mask(query_length=jnp.array(1)).array(2, 2)
    np.testing.assert_array_equal(queries, [[1, 1], [0, 0]])
    segments = Mask(
        causal=True, query_segments=jnp.array([0, 0, 1]), key_segments=jnp.array([0, 0, 1])
    ).array(3, 3)
    np.testing.assert_array_equal(segments, [[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    assert Mask().array(3, 3) is None and Mask().is_empty


def test_kernel_arguments_say_the_mask_in_lengths_and_flags():
    causal = Mask(causal=True).kernel_arguments(4, 4)
    assert causal is not None and causal.is_causal and causal.key_value_seq_lengths is None
    padded = Mask(causal=True, key_length=jnp.array(3)).kernel_arguments(4, 4)
    assert padded is not None and padded.is_causal
    np.testing.assert_array_equal(padded.key_value_seq_lengths, [3])
    # the kernels' window is (left, right) keys beside the query: zoo's window counts the query
    window = Mask(causal=True, window=3).kernel_arguments(4, 4)
    assert window is not None and window.local_window_size == (2, 0)
    # one query after a cache filled to 5: the first 6 keys, no causal order needed
    step = Mask(causal=True, offset=jnp.array(5)).kernel_arguments(1, 8)
    assert step is not None and not step.is_causal
    np.testing.assert_array_equal(step.key_value_seq_lengths, [6])
    lengths = Mask(key_length=jnp.array(3), query_length=jnp.array(2)).kernel_arguments(4, 4)
    assert lengths is not None
    np.testing.assert_array_equal(lengths.query_seq_lengths, [2])


def test_masks_that_need_an_array_say_so():
    segments = Mask(query_segments=jnp.zeros(3, int), key_segments=jnp.zeros(3, int))
    assert segments.kernel_arguments(3, 3) is None
    assert Mask(explicit=jnp.ones((3, 3), bool)).kernel_arguments(3, 3) is None
    # several queries after a cache whose fill is known only at run time
    assert Mask(causal=True, offset=jnp.array(2)).kernel_arguments(2, 8) is None
    # one query with a window after a cache: the window's start is not a length
    assert Mask(causal=True, window=4, offset=jnp.array(2)).kernel_arguments(1, 8) is None


def test_bad_masks_are_refused():
    with pytest.raises(ValueError, match="positive integer"):
        Mask(causal=True, window=0)
    with pytest.raises(ValueError, match="offset places queries for the causal order"):
        Mask(offset=jnp.array(1))
    with pytest.raises(ValueError, match="together"):
        Mask(query_segments=jnp.zeros(3, int))
    with pytest.raises(ValueError, match=r"shape \(2, 2\), but there are 3 queries and 3 keys"):
        Mask(explicit=jnp.ones((2, 2), bool)).array(3, 3)


def test_replace_changes_the_parts_named_and_keeps_the_rest():
    segments = jnp.array([0, 0, 1])
    mask = Mask(causal=True, window=2, offset=jnp.array(1), key_length=jnp.array(3))
    changed = mask.replace(query_segments=segments, key_segments=segments, window=None)
    assert changed.causal and changed.window is None
    assert changed.offset is mask.offset and changed.key_length is mask.key_length
    assert changed.query_segments is segments and changed.key_segments is segments
    assert changed.query_length is None and changed.explicit is None
    assert mask.window == 2 and mask.query_segments is None  # the original is untouched
    assert Mask().replace() == Mask()
    with pytest.raises(ValueError, match="positive integer"):
        mask.replace(window=0)  # checked as a new mask is
    with pytest.raises(TypeError, match="unexpected keyword argument 'lenght'"):
        mask.replace(lenght=jnp.array(2))


@pytest.mark.parametrize(
    "valid",
    [
        [1, 1, 1, 0, 0],  # right padding: nothing moves
        [0, 0, 1, 1, 1],  # left padding
        [1, 0, 1, 0, 1],  # holes
        [0, 0, 0, 0, 0],
    ],
)
def test_compaction_puts_real_tokens_first_in_order_and_back(valid):
    valid = jnp.array(valid, bool)
    values = jnp.arange(5) * 10
    compaction = Compaction.of(valid)
    count = int(valid.sum())
    assert int(compaction.length) == count
    moved = np.asarray(compaction.gather(values))
    np.testing.assert_array_equal(moved[:count], np.asarray(values)[np.asarray(valid)])
    np.testing.assert_array_equal(compaction.scatter(compaction.gather(values)), values)
    rows = jnp.arange(15).reshape(3, 5)
    np.testing.assert_array_equal(compaction.scatter(compaction.gather(rows, 1), 1), rows)
