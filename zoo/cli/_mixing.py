"""Several `--data` for `zoo train`: each spec with an optional weight, mixed into one dataset.

    zoo train gpt --data json:a.jsonl --data json:b.jsonl:0.3 ...

A weight is the share of the mix's rows drawn from that dataset (a probability); a spec without
one gets what the others leave, shared evenly (`a` above: 0.7). The splits are mixed one by
one with `datasets.interleave_datasets`, seeded by `--seed`, with the `first_exhausted`
stopping strategy: the mix ends when its first dataset runs out, so every row of it keeps the
proportions asked for and no dataset is repeated. With no weight at all, the datasets are
concatenated: every row of each, once. The datasets must have the same splits and columns.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

    from zoo.data.specs import DatasetDicts

STOPPING_STRATEGY = "first_exhausted"  # the mix ends with its first exhausted dataset
WEIGHT_TOLERANCE = 1e-6


class Datasets(argparse.Action):
    """`--data SPEC[:WEIGHT]`, repeatable: one spec as a string, several as a list in order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        earlier = getattr(namespace, self.dest, None)
        if earlier is None:
            setattr(namespace, self.dest, values)
            return
        specs = [earlier] if isinstance(earlier, str) else list(earlier)
        setattr(namespace, self.dest, [*specs, values])


def split_weight(spec: str) -> tuple[str, float | None]:
    """`json:b.jsonl:0.3` -> (`json:b.jsonl`, 0.3); a spec whose last part is no number has
    no weight."""
    head, separator, tail = spec.rpartition(":")
    if not separator or ":" not in head:
        return spec, None
    try:
        weight = float(tail)
    except ValueError:
        return spec, None
    if not 0.0 < weight <= 1.0:
        raise ValueError(
            f"--data {spec}: the weight {tail} is not a share in (0, 1]; give e.g. :0.3 for "
            "three rows in ten from this dataset"
        )
    return head, weight


def data_specs(given: str | Sequence[str]) -> str | list[str]:
    """The `--data` values as one spec (a string) or several (a list), weights checked."""
    specs = [given] if isinstance(given, str) else list(given)
    if len(specs) == 1:
        spec, weight = split_weight(specs[0])
        if weight is not None:
            raise ValueError(
                f"--data {specs[0]}: a weight mixes several datasets, and this is the only "
                f"one; drop :{specs[0].rpartition(':')[2]} or add another --data"
            )
        return spec
    weights(specs)  # refused now, before any data is read
    return specs


def weights(specs: Sequence[str]) -> list[float] | None:
    """Each spec's share of the mix (None: no spec has a weight, concatenate)."""
    given = [split_weight(spec)[1] for spec in specs]
    if all(weight is None for weight in given):
        return None
    named = sum(weight for weight in given if weight is not None)
    missing = sum(weight is None for weight in given)
    shown = " ".join(f"--data {spec}" for spec in specs)
    if missing == 0 and abs(named - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(
            f"the --data weights sum to {named:g}, not 1 ({shown}): they are the shares of the "
            "mix; make them add up to 1, or leave one out to take the rest"
        )
    if missing and named >= 1.0 - WEIGHT_TOLERANCE:
        raise ValueError(
            f"the --data weights sum to {named:g}, leaving nothing for the {missing} without "
            f"one ({shown}); lower them so that they add up to less than 1"
        )
    rest = (1.0 - named) / missing if missing else 0.0
    return [rest if weight is None else weight for weight in given]


def mix_datasets(
    specs: Sequence[str], load: Callable[[str], DatasetDicts], seed: int
) -> tuple[str, datasets.DatasetDict]:
    """(a label naming the mix, the mixed `DatasetDict`) of `specs`, each read by `load`."""
    import datasets

    shares = weights(specs)
    plain = [split_weight(spec)[0] for spec in specs]
    loaded = [load(spec) for spec in plain]
    first_splits = sorted(loaded[0])
    for spec, dataset in zip(plain[1:], loaded[1:], strict=True):
        if isinstance(dataset, datasets.IterableDatasetDict):
            raise ValueError(
                f"--data {spec}: several datasets are mixed in memory: drop --streaming"
            )
        if sorted(dataset) != first_splits:
            raise ValueError(
                f"--data {spec} has the splits {sorted(dataset)}, --data {plain[0]} has "
                f"{first_splits}: mixed datasets need the same splits (e.g. train and validation "
                "in each, or train alone in each)"
            )
    mixed = {}
    for split in first_splits:
        parts = [dataset[split] for dataset in loaded]
        for spec, part in zip(plain[1:], parts[1:], strict=True):
            if sorted(part.column_names) != sorted(parts[0].column_names):
                raise ValueError(
                    f"--data {spec} has the columns {sorted(part.column_names)} in its {split} "
                    f"split, --data {plain[0]} has {sorted(parts[0].column_names)}: mixed "
                    "datasets need the same columns; rename or drop columns first"
                )
        try:
            if shares is None:
                mixed[split] = datasets.concatenate_datasets(parts)
            else:
                mixed[split] = datasets.interleave_datasets(
                    parts, probabilities=shares, seed=seed, stopping_strategy=STOPPING_STRATEGY
                )
        except ValueError as error:  # the same columns, of different types
            shown = " ".join(f"--data {spec}" for spec in plain)
            raise ValueError(f"{shown}: the {split} splits cannot be mixed: {error}") from None
    label = " + ".join(specs)
    return label, datasets.DatasetDict(mixed)
