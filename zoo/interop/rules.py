"""How HuggingFace keys map to zoo keys: layout transforms, rules and key maps.

Each architecture (gpt2.py, bert.py, marian.py) describes its weights as a `KeyMap`: a list of
`Rule`s saying which HuggingFace key(s) hold which zoo leaf (or leaves) and how the array is laid
out (`Transform`), plus the keys whose values follow from the config (`Derived`) and the keys to
skip. `convert.py` runs a key map in either direction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

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


def rule(
    hf: str,
    zoo: str,
    transform: Transform = COPY,
    *,
    aliases: tuple[str, ...] = (),
    optional: bool = False,
    write_aliases: bool = False,
) -> Rule:
    """A one-to-one rule (the keywords are `Rule`'s)."""
    return Rule((hf,), (zoo,), transform, aliases, optional, write_aliases)


def weight_and_bias(
    hf: str, zoo: str, weight: Transform = COPY, *, optional: bool = False
) -> list[Rule]:
    """Rules for the `.weight` and `.bias` of a layer (a Linear, a LayerNorm, a Conv1D)."""
    return [
        rule(f"{hf}.weight", f"{zoo}.weight", weight, optional=optional),
        rule(f"{hf}.bias", f"{zoo}.bias", optional=optional),
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
