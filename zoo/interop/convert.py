"""The one conversion engine between HuggingFace state dicts and zoo models, both directions.

It knows nothing about any architecture: it runs a `KeyMap` (rules.py). Loading checks a
checkpoint against it first: missing keys, unexpected keys and wrong shapes are all reported
together, by name, with both shapes. Exporting runs the same rules backwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from zoo.interop.rules import KeyMap, Rule, Shape


class CheckpointMismatch(ValueError):
    """The checkpoint's keys or shapes differ from what the config says; the message names them."""


def _format_keys(keys: Iterable[str], limit: int = 12) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def expected_hf_shapes(key_map: KeyMap, shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    """The HF shape of every rule key (aliases included), implied by the zoo shapes."""
    expected = {}
    for r in key_map.rules:
        missing = [z for z in r.zoo if z not in shapes]
        if missing:
            raise KeyError(f"rule for {r.hf} names zoo keys the model lacks: {missing}")
        hf_shapes = r.transform.hf_shapes([shapes[z] for z in r.zoo])
        for hf_key, shape in zip(r.hf, hf_shapes, strict=True):
            expected[hf_key] = tuple(shape)
        if len(r.hf) == 1:
            for alias in r.aliases:
                expected[alias] = tuple(hf_shapes[0])
    return expected


def hf_to_zoo(
    arrays: Mapping[str, np.ndarray],
    key_map: KeyMap,
    shapes: Mapping[str, Shape],
    *,
    what: str = "checkpoint",
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Check `arrays` (an HF state dict) against `key_map` and convert them to zoo keys.

    Returns the zoo arrays and the zoo keys no rule filled (optional rules whose keys are absent,
    or parts the key map leaves out on purpose): the caller initialises those afresh. Raises
    `CheckpointMismatch` naming every missing, unexpected and misshapen key.
    """
    expected = expected_hf_shapes(key_map, shapes)
    missing: list[str] = []
    sources: list[tuple[Rule, list[str]]] = []
    for r in key_map.rules:
        present = [k for k in (*r.hf, *r.aliases) if k in arrays]
        if all(k in arrays for k in r.hf):
            sources.append((r, list(r.hf)))
        elif len(r.hf) == 1 and present:
            sources.append((r, [present[0]]))
        elif not (r.optional and not present):
            missing.extend(k for k in r.hf if k not in arrays)

    known = set(expected) | {d.hf for d in key_map.derived}
    unexpected = [k for k in arrays if k not in known and not key_map.ignored(k)]
    wrong = [
        f"{k}: {what} has {tuple(arrays[k].shape)}, the config implies {expected[k]}"
        for k in sorted(expected)
        if k in arrays and tuple(arrays[k].shape) != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_format_keys(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_format_keys(unexpected)}")
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong))
    if problems:
        raise CheckpointMismatch(
            f"the {what} does not match the model its config describes: "
            + " | ".join(problems)
            + ". Check that config.json belongs to these weights."
        )

    _check_ties(arrays, sources)
    _check_derived(arrays, key_map)
    state: dict[str, np.ndarray] = {}
    for r, keys in sources:
        for zoo_key, array in zip(
            r.zoo, r.transform.to_zoo([arrays[k] for k in keys]), strict=True
        ):
            state[zoo_key] = array
    fresh = sorted(set(shapes) - set(state))
    return state, fresh


def _check_ties(arrays: Mapping[str, np.ndarray], sources: list[tuple[Rule, list[str]]]) -> None:
    for r, keys in sources:
        if len(r.hf) != 1:
            continue
        for alias in (*r.hf, *r.aliases):
            if (
                alias in arrays
                and alias != keys[0]
                and not np.array_equal(arrays[alias], arrays[keys[0]])
            ):
                raise CheckpointMismatch(
                    f"{alias} and {keys[0]} should hold one tensor (the config ties them) but "
                    "differ; zoo cannot tell which of the two the model is meant to use"
                )


def _check_derived(arrays: Mapping[str, np.ndarray], key_map: KeyMap) -> None:
    for d in key_map.derived:
        if d.hf not in arrays:
            continue
        table = d.make()
        got = np.asarray(arrays[d.hf], np.float64)
        if got.shape != table.shape or np.max(np.abs(got - table)) > d.atol:
            raise CheckpointMismatch(
                f"{d.hf} differs from what zoo computes from the config ({d.what}); zoo cannot "
                "reproduce this checkpoint"
            )


def zoo_to_hf(
    state: Mapping[str, np.ndarray],
    key_map: KeyMap,
    *,
    aliases: bool = False,
    derived: bool = False,
) -> dict[str, np.ndarray]:
    """Convert zoo arrays (`zoo_state`) to an HF state dict.

    `aliases=True` also writes tied copies and `derived=True` the config-fixed tables, as in a
    torch `state_dict()`; a safetensors file leaves both out, as `save_pretrained` does.
    """
    out: dict[str, np.ndarray] = {}
    for r in key_map.rules:
        hf_arrays = r.transform.to_hf([state[z] for z in r.zoo])
        for hf_key, array in zip(r.hf, hf_arrays, strict=True):
            out[hf_key] = np.ascontiguousarray(array)
        if aliases or r.write_aliases:
            for alias in r.aliases:
                out[alias] = out[r.hf[0]]
    for d in key_map.derived:
        if derived or d.save:
            out[d.hf] = d.make().astype(np.float32)
    return out
