"""PEFT's `target_modules` for the modules zoo wrote adapters for, in the forms PEFT writes.

PEFT chooses a module for a target in a list when its name equals the target or ends with
`.TARGET`, and for a target given as one string when the string matches the whole name as a
regular expression. A run that adapts the same projections in every layer is written as the
short names a user gives PEFT (`["q_proj", "v_proj"]`; `attn.c_proj` where `c_proj` alone
would also choose GPT-2's `mlp.c_proj`). Where only the part from a layer's index on tells a
module apart (BERT's `layer.0.output.dense` beside `layer.0.attention.output.dense`), and where
the targeting differs between layers, the targets are one regular expression over the full
names (`bert\\.encoder\\.layer\\.\\d+\\.output\\.dense`, `model\\.layers\\.(?:0|3)\\.self_attn\\.q_proj`).
Either way the targets choose exactly the adapted modules among the model's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_INDEX = "#"  # an index part (a layer's, an expert's) in a name's template


def chooses(target: str, module: str) -> bool:
    """Whether PEFT puts an adapter on `module` for `target` in a list of targets."""
    return module == target or module.endswith(f".{target}")


def peft_targets(
    adapted: Iterable[str], modules: Iterable[str], *, named_elsewhere: Iterable[str] = ()
) -> list[str] | str:
    """`target_modules` choosing exactly the `adapted` HF modules among `modules` (every
    module an adapter could go on): a sorted list of short names, else one regex.
    `named_elsewhere`: adapted modules that other targets name (a mixture's experts), which
    these targets may choose too."""
    adapted = set(adapted)
    covered = adapted | set(named_elsewhere)
    candidates = set(modules) | covered
    targets = set()
    for module in sorted(adapted):
        target = _shortest_target(module, covered, candidates)
        if target is None:  # a layer index is part of what tells it apart
            return layer_pattern(adapted, candidates - (covered - adapted))
        targets.add(target)
    return sorted(targets)


def _shortest_target(module: str, adapted: set[str], candidates: set[str]) -> str | None:
    """The shortest dotted ending of `module`, without a layer index, that chooses adapted
    modules only; None when there is none."""
    parts = module.split(".")
    for length in range(1, len(parts) + 1):
        ending = parts[-length:]
        if any(part.isdigit() for part in ending):
            return None
        target = ".".join(ending)
        if all(name in adapted for name in candidates if chooses(target, name)):
            return target
    return None


def layer_pattern(adapted: Iterable[str], candidates: Iterable[str]) -> str:
    """One regex matching exactly the `adapted` names among `candidates`: a name's layer
    index is `\\d+` where every layer's module of that name is adapted, else the indices
    adapted (`a\\.(?:0|2)\\.q` for `a.0.q` and `a.2.q` alone)."""
    adapted = set(adapted)
    by_template: dict[str, list[str]] = {}
    for module in adapted:
        by_template.setdefault(_template(module), []).append(module)
    every: dict[str, set[str]] = {}
    for name in candidates:
        every.setdefault(_template(name), set()).add(name)
    pieces = []
    for template, modules in sorted(by_template.items()):
        parts = template.split(".")
        if every.get(template, set()) <= adapted:  # every layer's: any index
            pieces.append(_joined(parts, r"\d+"))
        elif parts.count(_INDEX) == 1:  # some layers': their indices
            indices = sorted(int(_indices(module)[0]) for module in modules)
            pieces.append(_joined(parts, "(?:" + "|".join(map(str, indices)) + ")"))
        else:
            pieces.extend(re.escape(module) for module in sorted(modules))
    return pieces[0] if len(pieces) == 1 else "(?:" + "|".join(pieces) + ")"


def _joined(parts: list[str], index: str) -> str:
    """The regex of a template's `parts`, each index part as `index`."""
    return r"\.".join(index if part == _INDEX else re.escape(part) for part in parts)


def _template(module: str) -> str:
    """`module` with each index part as `_INDEX` (`a.0.b.3.c` -> `a.#.b.#.c`)."""
    return ".".join(_INDEX if part.isdigit() else part for part in module.split("."))


def _indices(module: str) -> list[str]:
    return [part for part in module.split(".") if part.isdigit()]
