"""Which layer each stacked row is, in every `LayerStack` of a tree."""

from __future__ import annotations

from typing import NamedTuple

import jax

from zoo.nn.stack import LayerStack
from zoo.tree import path_name

STACK_FIELD = "blocks"  # LayerStack.blocks: arrays with a leading `layers` axis


class StackedRows(NamedTuple):
    """One stacked group of a `LayerStack`: the stack's path, the layer of each row, and the
    stack's number of layers."""

    stack: str
    layers: tuple[int, ...]
    depth: int


class LayerIndex:
    """Which layer each row of the stacked arrays of every `LayerStack` in a tree is: the
    layer numbers that saved weights, adapters and freezing name, whatever the groups."""

    def __init__(self, tree: object):
        """The stacks of `tree` (a model, or a pytree of its shape: its arrays, gradients)."""
        found, _ = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda node: isinstance(node, LayerStack)
        )
        self.groups: dict[str, StackedRows] = {}
        for path, stack in found:
            if not isinstance(stack, LayerStack):
                continue
            name = path_name(path)
            prefix = f"{name}.{STACK_FIELD}".lstrip(".")
            for group in range(len(stack.groups)):
                rows = StackedRows(name, stack.group_layers(group), stack.num_layers)
                key = prefix if len(stack.groups) == 1 else f"{prefix}.{group}"
                self.groups[key] = rows

    def rows(self, name: str) -> tuple[StackedRows, str] | None:
        """The stacked group holding the array at the dotted `name`, and the name inside a
        layer (`layers.blocks.1.feed_forward.x` -> group 1's rows, `feed_forward.x`); None for
        an array outside every stack."""
        for prefix, rows in self.groups.items():
            if name.startswith(f"{prefix}."):
                return rows, name[len(prefix) + 1 :]
        return None

    def layer_names(self, name: str) -> list[tuple[str, int]] | None:
        """The per-layer name and row of each row of the stacked array `name`
        (`layers.blocks.x` -> `[("layers.0.x", 0), ("layers.1.x", 1), ...]`), or None."""
        found = self.rows(name)
        if found is None:
            return None
        rows, inside = found
        stack = f"{rows.stack}." if rows.stack else ""
        return [(f"{stack}{layer}.{inside}", row) for row, layer in enumerate(rows.layers)]
