"""Bucketed and packed batch sources: bounded shapes, no lost tokens, determinism by step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from zoo.data import (
    BucketedBatches,
    DataConfig,
    DataError,
    Ragged,
    RandomBlocks,
    bucket_lengths,
    pack_blocks,
    packed_batches,
    unpack_blocks,
)
from zoo.data.bucketing import DrawnBatches, drawn_batch_longest
from zoo.data.options import fit_buckets, resolve_buckets


def random_rows(num, longest, seed=0):
    rng = np.random.default_rng(seed)
    return Ragged.from_rows(
        [rng.integers(1, 50, size=n).tolist() for n in rng.integers(1, longest + 1, size=num)]
    )


def bucketed(rows, source=BucketedBatches, **overrides):
    options = dict(
        pad_ids={"tokens": 0},
        batch_size=8,
        bucket_lengths=(16, 32, 64, 100),
        extras={"labels": np.arange(len(rows))},
        seed=3,
    )
    return source({"tokens": rows}, **(options | overrides))


def test_default_buckets_are_powers_of_two():
    assert bucket_lengths(128, None) == (16, 32, 64, 128)
    assert bucket_lengths(100, None) == (16, 32, 64, 100)
    assert bucket_lengths(10, None) == (10,)
    assert bucket_lengths(64, [40, 8, 40]) == (8, 40, 64)
    with pytest.raises(ValueError, match="exceeds max_len=64"):
        bucket_lengths(64, [128])


def padded_positions(needed, lengths, multiple=8, max_len=None):
    """Positions the examples of `needed` lengths pad to with bucket `lengths`."""
    return sum(min(b for b in lengths if b >= x) for x in needed)


def test_fitted_buckets_by_hand():
    # ten examples of 10 tokens, ten of 30, one of 60: three lengths pad nothing past the
    # multiple of 8, the last one is max_len
    needed = [10] * 10 + [30] * 10 + [60]
    assert fit_buckets(needed, max_len=128, count=3) == (16, 32, 64, 128)
    # two lengths, the last 64 (the longest example): 32 and 64 pad to 20*32 + 64 = 704
    # positions, 16 and 64 to 10*16 + 11*64 = 864
    assert fit_buckets(needed, max_len=128, count=2) == (32, 64, 128)
    assert fit_buckets(needed, max_len=128, count=1) == (64, 128)
    assert fit_buckets([10] * 30 + [60] * 2, max_len=128, count=2) == (16, 64, 128)
    assert fit_buckets([130, 3], max_len=100, count=4) == (8, 100)  # cut at max_len
    assert fit_buckets([], max_len=100) == (100,)


@pytest.mark.parametrize("seed", range(6))
def test_fitted_buckets_pad_the_least_of_any_choice(seed):
    rng = np.random.default_rng(seed)
    needed = rng.integers(1, 90, size=int(rng.integers(1, 60)))
    count, max_len = int(rng.integers(1, 4)), int(rng.integers(90, 120))
    fitted = fit_buckets(needed, max_len=max_len, count=count)
    assert len(fitted) <= count + 1 and fitted[-1] == max_len
    candidates = sorted({min(-(-int(x) // 8) * 8, max_len) for x in needed})
    best = min(
        padded_positions(needed, {*choice, candidates[-1]})
        for size in range(count)
        for choice in itertools.combinations(candidates, size)
    )
    assert padded_positions(needed, fitted) == best


def test_auto_buckets_fall_back_to_powers_of_two_without_lengths():
    assert resolve_buckets(128, "auto", None) == (16, 32, 64, 128)
    assert resolve_buckets(128, "auto", np.array([20, 21, 70])) == (24, 72, 128)
    assert resolve_buckets(128, None, np.array([20])) == (16, 32, 64, 128)
    with pytest.raises(ValueError, match="give 'auto'"):
        DataConfig(task="lm", buckets="fitted")


def test_buckets_bound_shapes_and_cover_an_epoch():
    rows = random_rows(203, 100)
    source = bucketed(rows)
    assert len(source) == 203 // 8
    shapes, seen = set(), []
    for batch in source:
        tokens, ids = batch["tokens"], batch["labels"]
        shapes.add(tokens.shape)
        for row, example in zip(tokens, ids):
            real = rows.row(int(example))
            np.testing.assert_array_equal(row[: len(real)], real)  # labels follow their rows
            assert (row[len(real) :] == 0).all()
        seen.extend(ids.tolist())
    assert len(shapes) <= 4 and {s[0] for s in shapes} == {8}
    assert len(seen) == len(set(seen)) == 25 * 8  # fewer than batch_size examples dropped


def test_most_rows_land_in_their_own_bucket():
    rows = Ragged.from_rows([[1] * 3] * 40 + [[2] * 50] * 40)
    lengths = [batch["tokens"].shape[1] for batch in bucketed(rows, extras=None)]
    assert sorted(lengths) == [16] * 5 + [64] * 5


def test_bucketed_batch_is_a_function_of_the_step():
    rows = random_rows(100, 60)
    source, again = bucketed(rows), bucketed(rows)
    for step in (0, 7, 12, 13, 30, 5):  # in any order, across epochs
        first, second = source.batch(step), again.batch(step)
        assert first.keys() == second.keys()
        for key in first:
            np.testing.assert_array_equal(first[key], second[key])
    epoch0 = [source.batch(s)["labels"].tolist() for s in range(len(source))]
    epoch1 = [source.batch(s + len(source))["labels"].tolist() for s in range(len(source))]
    assert epoch0 != epoch1
    assert bucketed(rows, seed=4).batch(0)["labels"].tolist() != epoch0[0]


def test_evaluation_order_keeps_every_example():
    rows = random_rows(21, 60)
    source = bucketed(rows, shuffle=False, drop_last=False)
    assert len(source) == 3
    ids = np.concatenate([batch["labels"] for batch in source])
    assert sorted(ids.tolist()) == list(range(21))


def test_pairs_bucket_on_the_longer_side():
    src = Ragged.from_rows([[5] * 3, [5] * 20, [5] * 3, [5] * 3])
    tgt = Ragged.from_rows([[6] * 20, [6] * 3, [6] * 3, [6] * 3])
    source = BucketedBatches(
        {"src": src, "tgt": tgt},
        pad_ids={"src": 0, "tgt": 0},
        batch_size=2,
        bucket_lengths=(8, 32),
        shuffle=False,
    )
    shapes = [(b["src"].shape, b["tgt"].shape) for b in source]
    assert shapes == [((2, 8), (2, 8)), ((2, 32), (2, 32))]


def test_too_long_row_is_refused():
    with pytest.raises(ValueError, match="more than the longest bucket"):
        bucketed(Ragged.from_rows([[1] * 101] * 8))


def test_packing_loses_no_token():
    stream = np.arange(1, 1001, dtype=np.int32)
    for block_size in (1, 7, 64, 999, 1200):
        blocks = pack_blocks(stream, block_size, pad_id=0)
        assert blocks.shape[1] == block_size + 1
        assert blocks.shape[0] == -(-999 // block_size)
        np.testing.assert_array_equal(unpack_blocks(blocks, len(stream)), stream)
        # every (token, next token) pair of the stream appears in exactly one block
        pairs = {(a, b) for row in blocks for a, b in itertools.pairwise(row) if b}
        assert len(pairs) == 999
    np.testing.assert_array_equal(pack_blocks(stream[:6], 2, 0), [[1, 2, 3], [3, 4, 5], [5, 6, 0]])


def test_packed_batches_shuffle_blocks_per_epoch():
    source = packed_batches(np.arange(1, 202), block_size=10, batch_size=4, pad_id=0, seed=0)
    assert len(source) == 20 // 4
    np.testing.assert_array_equal(source.batch(3)["tokens"], source.batch(3)["tokens"])
    assert source.batch(0)["tokens"].tolist() != source.batch(5)["tokens"].tolist()
    with pytest.raises(DataError, match="fewer than batch_size=64"):
        packed_batches(np.arange(100), block_size=10, batch_size=64, pad_id=0)


def test_random_blocks_are_windows_seeded_by_step():
    stream = np.arange(5000, dtype=np.int32)
    source = RandomBlocks(stream, block_size=16, batch_size=4, seed=1)
    assert len(source) == 4999 // 64
    tokens = source.batch(9)["tokens"]
    assert tokens.shape == (4, 17)
    np.testing.assert_array_equal(np.diff(tokens, axis=1), 1)  # contiguous windows
    np.testing.assert_array_equal(
        tokens, RandomBlocks(stream, block_size=16, batch_size=4, seed=1).batch(9)["tokens"]
    )
    assert tokens.tolist() != source.batch(10)["tokens"].tolist()
    with pytest.raises(DataError, match="fewer than one block"):
        RandomBlocks(stream[:10], block_size=16, batch_size=4)


def test_drawn_batches_mix_lengths_and_pad_to_their_longest_bucket():
    rows = random_rows(203, 100)
    source = bucketed(rows, DrawnBatches)
    assert len(source) == 203 // 8
    seen, mixed = [], 0
    for step in range(len(source)):
        batch = source.batch(step)
        lengths = [len(rows.row(int(i))) for i in batch["labels"]]
        width = batch["tokens"].shape[1]
        assert width == min(b for b in (16, 32, 64, 100) if b >= max(lengths))
        mixed += len({min(b for b in (16, 32, 64, 100) if b >= n) for n in lengths}) > 1
        seen.extend(batch["labels"].tolist())
    assert len(seen) == len(set(seen)) == 25 * 8 and mixed > 20  # one draw, most batches mixed
    again = bucketed(rows, DrawnBatches)
    np.testing.assert_array_equal(again.batch(30)["tokens"], source.batch(30)["tokens"])
    assert not np.array_equal(source.batch(0)["labels"], source.batch(25)["labels"])  # epoch 2
    # the buckets fitted to drawn batches hold their longest examples
    longest = drawn_batch_longest(rows.lengths, 8, seed=3)
    first = np.random.default_rng((3, 0)).permutation(203)[:8]  # epoch 0's first batch
    assert len(longest) == 4 * 25 and longest[0] == rows.lengths[first].max()
    assert [len(rows.row(int(i))) for i in source.batch(0)["labels"]] == rows.lengths[
        first
    ].tolist()
