"""`--precompute-reference`: the reference's log-probabilities of every pair, computed once with
a progress report, and kept in the run folder for `--resume`.

On a terminal the pass draws a progress bar; otherwise (a log file) it prints a line when it
starts, one every `LINE_EVERY_S` seconds with the batches done, the total and the rate, and one
when it ends. The numbers are saved in `OUT/reference_logps.npz` with a digest of what they
depend on: the reference's weights and config, and the tokenized pairs (the data's rows as the
tokenizer, the template and the truncation made them). A later start in the same folder
(`--resume`) reads them back when the digest matches, and computes them again, saying why, when
it does not.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import equinox as eqx
import jax
import numpy as np

from zoo.data.batches import ArrayBatches, BatchSource
from zoo.files import write_atomic
from zoo.progress import Progress
from zoo.tasks.base import LanguageModel
from zoo.tasks.preference_reference import reference_numbers, with_reference_numbers

REFERENCE_FILE = "reference_logps.npz"
LINE_EVERY_S = 10.0  # seconds between two progress lines in a log
PAIR_ARRAYS = ("tokens", "loss_mask", "lengths")  # what a pair's log-probabilities read


def pass_progress(
    total: int, *, shown: bool, stream: io.TextIOBase | TextIO | None = None
) -> Progress:
    """The pass's progress when `shown` (`zoo.progress`: a bar on a terminal, a line every
    `LINE_EVERY_S` seconds in a log), after a line that says how many batches it has."""
    stream = sys.stderr if stream is None else stream
    print(f"zoo train: reference pass: {total} batches", file=stream, flush=True)
    return Progress(total=total, description="zoo train: reference pass", unit="batches",
                    enabled=shown, log_every=LINE_EVERY_S, stream=stream)  # fmt: skip


def finish(progress: Progress) -> None:
    """Close the pass's progress with one line of what it did (in a log, the last word)."""
    progress.close()
    elapsed = time.monotonic() - progress.started
    rate = progress.done / elapsed if elapsed > 0 else 0.0
    print(f"zoo train: reference pass: done, {progress.done} batches in {elapsed:.1f} s "
          f"({rate:.2f} batches/s)", file=progress.stream, flush=True)  # fmt: skip


def _hash_arrays(digest: hashlib.blake2b, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())


def weights_digest(model: object) -> str:
    """A digest of `model`'s arrays, their paths and its static settings (config, adapters)."""
    leaves, treedef = jax.tree_util.tree_flatten(eqx.filter(model, eqx.is_array))
    digest = hashlib.blake2b(str(treedef).encode(), digest_size=16)
    _hash_arrays(digest, [np.asarray(leaf) for leaf in leaves])
    return digest.hexdigest()


def pairs_digest(splits: Mapping[str, ArrayBatches]) -> str:
    """A digest of the tokenized pairs of every split, in the arrays' order."""
    digest = hashlib.blake2b(digest_size=16)
    for name, batches in splits.items():
        digest.update(name.encode())
        _hash_arrays(digest, [batches.arrays[key] for key in PAIR_ARRAYS])
    return digest.hexdigest()


DIGEST_PARTS = {"weights": "the reference's weights", "pairs": "the tokenized pairs"}


def _saved(path: Path, digest: dict[str, str], splits: Mapping[str, ArrayBatches]):
    """`(numbers by split, None)` from `path`, or `(None, why they cannot be used)`."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            held = json.loads(str(saved["digest"]))
            numbers = {name: np.asarray(saved[name]) for name in splits if name in saved}
    except (OSError, ValueError, KeyError) as error:
        return None, f"the file cannot be read: {error}"
    changed = [what for key, what in DIGEST_PARTS.items() if held.get(key) != digest[key]]
    if changed:
        return None, f"{' and '.join(changed)} changed"
    for name, batches in splits.items():
        if numbers.get(name) is None or numbers[name].shape != (batches.num_examples, 2):
            return None, f"it holds no numbers for the {name} pairs"
    return numbers, None


def precomputed(
    splits: Mapping[str, BatchSource],
    reference: LanguageModel,
    *,
    out: Path | None,
    progress: bool,
) -> dict[str, ArrayBatches]:
    """`splits` (train, validation) with the reference's numbers in their arrays: read from
    `out/REFERENCE_FILE` when its digest matches, else computed (a bar or log lines: `progress`
    allows the bar) and saved there (`out` None: not kept)."""
    arrays: dict[str, ArrayBatches] = {}
    for name, batches in splits.items():
        if not isinstance(batches, ArrayBatches):
            raise ValueError(
                f"--precompute-reference keeps the numbers beside the pairs in memory, and the "
                f"{name} pairs are a {type(batches).__name__}: drop --precompute-reference"
            )
        arrays[name] = batches
    digest = {"weights": weights_digest(reference), "pairs": pairs_digest(arrays)}
    path = None if out is None else out / REFERENCE_FILE
    if path is not None and path.is_file():
        numbers, why = _saved(path, digest, arrays)
        if numbers is not None:
            print(f"zoo train: reference log-probabilities read from {path} (its digest "
                  "matches)", file=sys.stderr)  # fmt: skip
            return {name: with_reference_numbers(b, numbers[name]) for name, b in arrays.items()}
        print(f"zoo train: {path} is not this run's reference ({why}): computing it again",
              file=sys.stderr)  # fmt: skip
    total = sum(-(-batches.num_examples // batches.batch_size) for batches in arrays.values())
    report = pass_progress(total, shown=progress)
    numbers = {
        name: reference_numbers(batches, reference, progress=report.advance)
        for name, batches in arrays.items()
    }
    finish(report)
    if path is not None:
        fields: dict[str, np.ndarray] = {"digest": np.asarray(json.dumps(digest)), **numbers}
        write_atomic(path, lambda tmp: _save_npz(tmp, fields))
    return {name: with_reference_numbers(b, numbers[name]) for name, b in arrays.items()}


def _save_npz(path: Path, fields: dict[str, np.ndarray]) -> None:
    with path.open("wb") as file:  # a file object: np.savez would add ".npz" to the name
        np.savez(file, allow_pickle=False, **fields)
