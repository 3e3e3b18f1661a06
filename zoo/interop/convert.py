"""The one conversion engine between HuggingFace state dicts and zoo models, both directions.

Each architecture (gpt2.py, bert.py, marian.py) describes its weights as a list of `Rule`s: which
HuggingFace key(s) hold which zoo leaf (or leaves) and how the array is laid out (`Transform`).
This file knows nothing about any architecture. It

- names a zoo model's arrays with flat, per-layer keys (`layers.3.self_attention.query_proj.weight`:
  the stacked `layers` axis is split into one key per layer, like a torch state dict),
- checks a checkpoint against the rules: missing keys, unexpected keys and wrong shapes are all
  reported together, by name, with both shapes,
- converts in either direction with the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

Shape = tuple[int, ...]

# --------------------------------------------------------------------------------------------
# transforms: how one HuggingFace array maps to zoo arrays
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transform:
    """A layout change: `to_zoo` maps the HF arrays of a rule to its zoo arrays, `to_hf` back."""

    name: str
    to_zoo: Callable[[list[np.ndarray]], list[np.ndarray]]
    to_hf: Callable[[list[np.ndarray]], list[np.ndarray]]
    hf_shapes: Callable[[list[Shape]], list[Shape]]  # HF shapes implied by the zoo shapes


def _split3(array: np.ndarray) -> list[np.ndarray]:
    return list(np.split(array, 3, axis=0))


COPY = Transform("copy", lambda a: a, lambda z: z, lambda s: s)
# torch Linear and zoo Linear are both [out, in]; GPT-2's Conv1D is [in, out].
TRANSPOSE = Transform(
    "transpose",
    lambda a: [a[0].T],
    lambda z: [z[0].T],
    lambda s: [s[0][::-1]],
)
# GPT-2's fused c_attn: one Conv1D [in, 3 * out] -> query, key, value Linear weights [out, in].
FUSED_QKV_WEIGHT = Transform(
    "fused query/key/value weight (transposed)",
    lambda a: _split3(a[0].T),
    lambda z: [np.concatenate(z, axis=0).T],
    lambda s: [(s[0][1], s[0][0] + s[1][0] + s[2][0])],
)
FUSED_QKV_BIAS = Transform(
    "fused query/key/value bias",
    lambda a: _split3(a[0]),
    lambda z: [np.concatenate(z, axis=0)],
    lambda s: [(s[0][0] + s[1][0] + s[2][0],)],
)
# MarianMT's final_logits_bias is a [1, vocab] buffer; zoo's output_bias is [vocab].
ROW = Transform(
    "row vector",
    lambda a: [a[0].reshape(-1)],
    lambda z: [z[0].reshape(1, -1)],
    lambda s: [(1, *s[0])],
)


@dataclass(frozen=True)
class Rule:
    """HuggingFace key(s) `hf` hold zoo leaf key(s) `zoo`, converted by `transform`.

    `aliases` are other HF keys holding the same (tied) tensor: any that are present must equal
    the one used. An `optional` rule whose keys are all absent leaves the zoo leaves freshly
    initialised (a new classification head, a zero logits bias).
    """

    hf: tuple[str, ...]
    zoo: tuple[str, ...]
    transform: Transform = COPY
    aliases: tuple[str, ...] = ()
    optional: bool = False
    write_aliases: bool = False  # write the tied copies to files too (where nothing re-ties them)


def rule(hf: str, zoo: str, transform: Transform = COPY, **kwargs: Any) -> Rule:
    """A one-to-one rule."""
    return Rule((hf,), (zoo,), transform, **kwargs)


def weight_and_bias(hf: str, zoo: str, weight: Transform = COPY, **kwargs: Any) -> list[Rule]:
    """Rules for the `.weight` and `.bias` of a layer (a Linear, a LayerNorm, a Conv1D)."""
    return [
        rule(f"{hf}.weight", f"{zoo}.weight", weight, **kwargs),
        rule(f"{hf}.bias", f"{zoo}.bias", **kwargs),
    ]


@dataclass(frozen=True)
class Derived:
    """An HF key whose value follows from the config (a fixed sinusoid table, say).

    Loading checks it if present; exporting writes it where transformers' `state_dict` has it.
    """

    hf: str
    make: Callable[[], np.ndarray]
    what: str  # what the table is, for the error when a checkpoint's differs
    save: bool = False  # also written to safetensors files (else only to torch state dicts)
    atol: float = 1e-4


@dataclass(frozen=True)
class KeyMap:
    """Everything the engine needs for one architecture and one config."""

    rules: list[Rule]
    derived: list[Derived] = field(default_factory=list)
    ignore: tuple[str, ...] = ()  # regexes of HF keys that carry nothing zoo computes

    def ignored(self, key: str) -> bool:
        return any(re.fullmatch(pattern, key) for pattern in self.ignore)


class CheckpointMismatch(ValueError):
    """The checkpoint's keys or shapes differ from what the config says; the message names them."""


# --------------------------------------------------------------------------------------------
# zoo side: flat per-layer names for a model's arrays
# --------------------------------------------------------------------------------------------

STACK_FIELD = "blocks"  # LayerStack.blocks: arrays with a leading `layers` axis


def _is_leaf_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _path_names(path: tuple[Any, ...]) -> list[str]:
    names = []
    for entry in path:
        for attr in ("name", "key", "idx"):
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)))
                break
        else:
            raise TypeError(f"unexpected pytree path entry {entry!r}")
    return names


def _leaf_names(path: tuple[Any, ...], shape: Shape) -> list[tuple[str, int | None]]:
    """The flat key(s) of one leaf: one per layer for stacked leaves (with the layer index)."""
    parts = _path_names(path)
    if STACK_FIELD not in parts:
        return [(".".join(parts), None)]
    at = parts.index(STACK_FIELD)
    return [
        (".".join([*parts[:at], str(index), *parts[at + 1 :]]), index) for index in range(shape[0])
    ]


def zoo_shapes(model: Any) -> dict[str, Shape]:
    """Flat per-layer key -> shape of every array in `model` (arrays or `ShapeDtypeStruct`s)."""
    shapes = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=_is_leaf_array)
    for path, leaf in leaves:
        if not _is_leaf_array(leaf):
            continue
        for name, index in _leaf_names(path, tuple(leaf.shape)):
            shapes[name] = tuple(leaf.shape) if index is None else tuple(leaf.shape[1:])
    return shapes


def zoo_state(model: Any, *, as_numpy: bool = True) -> dict[str, Any]:
    """Flat per-layer key -> array of every array in `model`.

    numpy arrays by default; `as_numpy=False` keeps jax arrays (usable under `jax.jit`).
    """
    state = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=_is_leaf_array)
    for path, leaf in leaves:
        if not _is_leaf_array(leaf):
            continue
        array = np.asarray(leaf) if as_numpy else leaf
        for name, index in _leaf_names(path, tuple(array.shape)):
            state[name] = array if index is None else array[index]
    return state


def fill(skeleton: Any, state: Mapping[str, np.ndarray]) -> Any:
    """`skeleton` (e.g. from `eqx.filter_eval_shape`) with its arrays taken from `state`.

    Arrays are cast to the skeleton's dtypes; stacked leaves are stacked back on `layers`.
    """

    def take(path, leaf):
        if not _is_leaf_array(leaf):
            return leaf
        names = _leaf_names(path, tuple(leaf.shape))
        if names[0][1] is None:
            array = state[names[0][0]]
        else:
            array = np.stack([state[name] for name, _ in names])
        if tuple(array.shape) != tuple(leaf.shape):
            raise CheckpointMismatch(
                f"{names[0][0]}: got shape {tuple(array.shape)}, the model needs {tuple(leaf.shape)}"
            )
        return jnp.asarray(array, dtype=leaf.dtype)

    return jax.tree_util.tree_map_with_path(take, skeleton, is_leaf=_is_leaf_array)


def abstract_model(build: Callable[[], eqx.Module]) -> Any:
    """The model `build` makes, as shapes only (no memory for weights)."""
    return eqx.filter_eval_shape(build)


# --------------------------------------------------------------------------------------------
# checking and converting
# --------------------------------------------------------------------------------------------


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
