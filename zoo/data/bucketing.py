"""Length bucketing: batches padded to one of a few lengths, so XLA compiles a few times.

Two ways to form the batches, both a pure function of `(seed, epoch)` and the step:

- `DrawnBatches` (`group_by_length=False`, the data configs' default): each epoch shuffles every
  example and cuts the order into batches, as PyTorch's samplers do; a batch pads to the
  shortest bucket that holds its longest example.
- `BucketedBatches` (`group_by_length=True`): every example goes to the shortest bucket that
  holds it (for a pair, its longer side decides and both sides pad to that length); each epoch
  shuffles the examples inside every bucket, cuts the buckets into batches, and shuffles the
  order of the batches. The examples a bucket cannot fill a batch with move up to the next
  bucket (padded a little more). Less padding, but each batch holds examples of one length: on
  short fine-tunes this measured worse held-out accuracy ([results](../docs/results.md)).

Either way an epoch drops fewer than `batch_size` examples in all, and every epoch has
`num_examples // batch_size` batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from zoo.data.batches import Batch, check_examples
from zoo.data.ragged import Ragged


class BucketedBatches:
    """Batches of ragged sequences (and per-example arrays) padded to bucket lengths.

    Args:
        sequences: batch keys -> token sequences (`tokens`, or `src` and `tgt`).
        pad_ids: each sequence's pad id, by the same keys.
        batch_size: examples per batch.
        bucket_lengths: the padded lengths; the longest must hold every example.
        extras: batch keys -> per-example arrays copied as they are (`labels`).
        shuffle: reshuffle every epoch from `(seed, epoch)` (see the module doc); False: in
            order.
        seed: the shuffling seed.
        drop_last: drop the last, smaller batch of an epoch (False keeps it, for evaluation).

    The batches hold one bucket's examples each (`group_by_length=True`); `DrawnBatches` draws
    them at random instead (see the module doc).
    """

    group_by_length = True

    def __init__(
        self,
        sequences: dict[str, Ragged],
        *,
        pad_ids: dict[str, int],
        batch_size: int,
        bucket_lengths: Sequence[int],
        extras: dict[str, np.ndarray] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ):
        sizes = {name: len(rows) for name, rows in sequences.items()}
        sizes |= {name: len(values) for name, values in (extras or {}).items()}
        num = check_examples(sizes, batch_size, drop_last)
        self.lengths = tuple(sorted(int(length) for length in bucket_lengths))
        longest = np.max(np.stack([rows.lengths for rows in sequences.values()]), axis=0)
        if longest.max() > self.lengths[-1]:
            raise ValueError(
                f"an example has {int(longest.max())} tokens, more than the longest bucket "
                f"({self.lengths[-1]}); truncate the examples or add a longer bucket"
            )
        self.longest = longest
        bucket_of = np.searchsorted(np.asarray(self.lengths), longest, side="left")
        self.members = [np.flatnonzero(bucket_of == b) for b in range(len(self.lengths))]
        self.sequences = sequences
        self.extras = {name: np.asarray(values) for name, values in (extras or {}).items()}
        self.pad_ids = pad_ids
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_examples = num
        self.num_batches = num // batch_size if drop_last else -(-num // batch_size)
        self._plan_cache: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def __len__(self) -> int:
        return self.num_batches

    def plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """The epoch's batches as (padded length, example indices), in step order."""
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        rng = _epoch_rng(self.seed, epoch)
        batches: list[tuple[int, np.ndarray]] = []
        if not self.group_by_length:
            batches = self._drawn(rng)
            self._plan_cache = (epoch, batches)
            return batches
        carried = np.zeros(0, dtype=np.int64)
        for length, members in zip(self.lengths, self.members):
            pool = np.concatenate([carried, rng.permutation(members) if self.shuffle else members])
            full = len(pool) // self.batch_size
            for k in range(full):
                batches.append((length, pool[k * self.batch_size : (k + 1) * self.batch_size]))
            carried = pool[full * self.batch_size :]
        if len(carried) and not self.drop_last:
            batches.append((self.lengths[-1], carried))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._plan_cache = (epoch, batches)
        return batches

    def _drawn(self, rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
        """One epoch of batches of examples in a random order (in order without `shuffle`),
        each padded to the shortest bucket that holds its longest example."""
        count = len(self.longest)
        order = rng.permutation(count) if self.shuffle else np.arange(count)
        cuts = [
            order[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.num_batches)
        ]
        longest = [self.longest[rows].max() for rows in cuts]
        where = np.searchsorted(np.asarray(self.lengths), longest)
        return [(self.lengths[int(w)], rows) for w, rows in zip(where, cuts, strict=True)]

    def batch(self, step: int) -> Batch:
        epoch, index = divmod(step, self.num_batches)
        length, rows = self.plan(epoch)[index]
        out = {
            name: seqs.padded(rows, length, self.pad_ids[name])
            for name, seqs in self.sequences.items()
        }
        out |= {name: values[rows].astype(np.int32) for name, values in self.extras.items()}
        return out

    def __iter__(self) -> Iterator[Batch]:
        """One epoch, in order of steps 0..len-1."""
        return (self.batch(step) for step in range(self.num_batches))


class DrawnBatches(BucketedBatches):
    """`BucketedBatches` whose batches are drawn at random from every example each epoch (in
    order without `shuffle`), each padded to the shortest bucket that holds its longest example
    (`group_by_length=False`, see the module doc). The same arguments."""

    group_by_length = False


def batches_of(group_by_length: bool) -> type[BucketedBatches]:
    """`BucketedBatches` (batches of one bucket) or `DrawnBatches` (drawn at random)."""
    return BucketedBatches if group_by_length else DrawnBatches


def lengths_to_fit(
    longest: np.ndarray, *, group_by_length: bool, batch_size: int, seed: int
) -> np.ndarray:
    """The lengths the buckets must fit (`zoo.data.options.fit_buckets`): each example's when
    batches are grouped by length, each drawn batch's longest otherwise."""
    return longest if group_by_length else drawn_batch_longest(longest, batch_size, seed)


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random numbers of one epoch's batches."""
    return np.random.default_rng((seed, epoch))


def drawn_batch_longest(
    longest: np.ndarray, batch_size: int, seed: int, *, epochs: int = 4
) -> np.ndarray:
    """The longest example of each batch of `epochs` epochs drawn at random (as
    `DrawnBatches` draws them): what buckets fitted to such batches should hold
    (`zoo.data.options.fit_buckets`)."""
    found = []
    for epoch in range(epochs):
        order = _epoch_rng(seed, epoch).permutation(len(longest))
        usable = len(order) // batch_size * batch_size or len(order)
        found.append(longest[order[:usable]].reshape(-1, min(batch_size, usable)).max(axis=1))
    return np.concatenate(found)
