"""Freezing parameters: `--freeze embeddings,layers:0-5` as an optax mask.

A spec is a comma-separated list of groups:

| group | freezes |
| --- | --- |
| `embeddings` | every array of an embedder (token, position, type tables and their norms) |
| `layers:A-B` (or `layers:A`) | transformer blocks A..B inclusive, in every stack (encoder, decoder) |
| `encoder:A-B`, `decoder:A-B` | blocks A..B of that stack only |
| any other name, e.g. `head`, `encoder`, `final_norm` | the arrays whose dotted path starts there |

Whole arrays are frozen with `optax.multi_transform(..., optax.set_to_zero())`; blocks that
share a stacked array (layers run with `lax.scan` keep one array per weight with the layer as
axis 0) have the updates of the frozen slices set to zero after the optimizer, so weight decay
cannot move them either. Frozen parameters stay bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import PyTree

from zoo.nn.layer_index import LayerIndex, StackedRows
from zoo.train.optim import Optimizer, OptimizerLike
from zoo.tree import path_name

STACKS = ("layers", "encoder", "decoder")


@dataclass(frozen=True)
class FreezeGroup:
    name: str  # embeddings | layers | encoder | decoder | a path prefix
    first: int | None = None  # first frozen block (None: the whole group)
    last: int | None = None  # last frozen block, inclusive


def parse_freeze(spec: str) -> tuple[FreezeGroup, ...]:
    """`"embeddings,layers:0-5"` -> groups; a malformed range raises with the expected form."""
    groups = []
    for part in (piece.strip() for piece in spec.split(",")):
        if not part:
            continue
        name, separator, blocks = part.partition(":")
        if not separator:
            groups.append(FreezeGroup(name))
            continue
        if name not in STACKS:
            raise ValueError(f"--freeze {part!r}: block ranges go with {', '.join(STACKS)}")
        first_text, _, last_text = blocks.partition("-")
        try:
            first, last = int(first_text), int(last_text or first_text)
        except ValueError:
            message = f"--freeze {part!r}: write the blocks as {name}:A-B, e.g. {name}:0-5"
            raise ValueError(message) from None
        if not 0 <= first <= last:
            raise ValueError(f"--freeze {part!r}: need 0 <= A <= B")
        groups.append(FreezeGroup(name, first, last))
    if not groups:
        raise ValueError("--freeze needs at least one group, e.g. embeddings or layers:0-5")
    return tuple(groups)


def _rows(path: str, index: LayerIndex, stack: str) -> StackedRows | None:
    """The rows of the stacked array `path` if it is in the stack `stack` (`layers` names
    every stack: a translator's encoder and decoder too); None otherwise."""
    found = index.rows(path)
    if found is None:
        return None
    rows, _ = found
    return rows if stack == "layers" or rows.stack == stack else None


def _block_axis_frozen(
    path: str, num_blocks: int, groups: tuple[FreezeGroup, ...], index: LayerIndex
) -> np.ndarray:
    frozen = np.zeros(num_blocks, bool)
    for group in groups:
        if group.first is None or group.last is None:
            continue
        rows = _rows(path, index, group.name)
        if rows is not None:
            layers = np.asarray(rows.layers)
            frozen |= (layers >= group.first) & (layers <= group.last)
    return frozen


def _whole(path: str, groups: tuple[FreezeGroup, ...]) -> bool:
    for group in groups:
        if group.first is not None:
            continue
        if group.name == "embeddings" and "embedder" in path:
            return True
        if path == group.name or path.startswith(f"{group.name}."):
            return True
    return False


def freeze_labels(params: PyTree, groups: tuple[FreezeGroup, ...]) -> PyTree:
    """ "frozen" or "train" for every array leaf of `params` (a model or its filtered arrays)."""

    def label(path, leaf):
        return "frozen" if _whole(path_name(path), groups) else "train"

    return jax.tree_util.tree_map_with_path(label, params)


def _zero_frozen_blocks(groups: tuple[FreezeGroup, ...]) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        index = LayerIndex(updates)

        def zero(path, update):
            if update is None or update.ndim == 0:
                return update
            frozen = _block_axis_frozen(path_name(path), update.shape[0], groups, index)
            if not frozen.any():
                return update
            shape = (update.shape[0],) + (1,) * (update.ndim - 1)
            return jnp.where(jnp.asarray(frozen).reshape(shape), jnp.zeros_like(update), update)

        return jax.tree_util.tree_map_with_path(zero, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def check_freeze(model: eqx.Module, groups: tuple[FreezeGroup, ...]) -> dict[str, int]:
    """Frozen element count per group; a group that matches nothing raises with the names."""
    params = eqx.filter(model, eqx.is_inexact_array)
    named = {
        path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    index = LayerIndex(params)
    counts = {}
    for group in groups:
        count = 0
        for path, leaf in named.items():
            rows = _rows(path, index, group.name)
            if group.first is None:
                count += leaf.size if _whole(path, (group,)) else 0
            elif rows is not None:
                if group.last is not None and group.last >= rows.depth:
                    raise ValueError(
                        f"--freeze {group.name}:{group.first}-{group.last}: {path} has only "
                        f"{rows.depth} blocks (0-{rows.depth - 1})"
                    )
                frozen = _block_axis_frozen(path, leaf.shape[0], (group,), index)
                count += int(frozen.sum()) * (leaf.size // leaf.shape[0])
        if count == 0:
            tops = sorted({path.split(".")[0] for path in named})
            raise ValueError(
                f"--freeze {group.name!r} matches no parameter; groups: embeddings, "
                f"layers:A-B, encoder:A-B, decoder:A-B, or a path prefix ({', '.join(tops)})"
            )
        counts[
            group.name if group.first is None else f"{group.name}:{group.first}-{group.last}"
        ] = count
    return counts


def train_only(
    optimizer: OptimizerLike,
    labels: Callable[[PyTree], PyTree],
    setting: tuple,
    *after: optax.GradientTransformation,
) -> Optimizer:
    """`optimizer` on the arrays `labels(params)` marks "train"; "frozen" ones get 0 and no state.

    `setting` is recorded in the optimizer's settings (compiled steps are shared by settings);
    `after` are transformations chained after the masked optimizer.
    """
    masked = optax.chain(
        optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels),
        *after,
    )
    settings = (*getattr(optimizer, "settings", ()), setting)
    learning_rate = getattr(optimizer, "learning_rate", None)
    return Optimizer(masked.init, masked.update, learning_rate, settings, labels)


def freeze(optimizer: OptimizerLike, spec: str) -> Optimizer:
    """`optimizer` with the parameters named by `spec` frozen (their updates are exactly 0)."""
    groups = parse_freeze(spec)
    return train_only(
        optimizer,
        lambda params: freeze_labels(params, groups),
        ("freeze", groups),
        _zero_frozen_blocks(groups),
    )
