"""Partition rules as data: which mesh axes split each dimension of each parameter.

A rule is `(pattern, spec)`. `pattern` is a regular expression searched (`re.search`) in the
array's dotted pytree path (`zoo.tree.path_name`); the first rule that matches wins, so a
rule also matches the optimizer state's copies of that parameter (`0.mu.` + its path). `spec`
names a mesh axis (or None) for each of the array's last dimensions; a leading dimension more
(a `LayerStack`'s `layers` axis) is never split. A dimension an axis does not divide stays
whole (a vocabulary of 50257 rows), except the heads and the feed-forward width under
`tensor`, which `check_tensor` requires to divide.

Weights are `[out, in]`: the attention's query/key/value projections are
`[heads * head_dim, d_model]` (key/value: `kv_heads * head_dim`), so `tensor` splits whole
heads; the feed-forward's gate/hidden are `[d_ff, d_model]` and its output `[d_model, d_ff]`.
Arrays no rule matches are kept whole on every device (`describe` shows them).

To extend the table (say for LoRA's `lora_a [rank, in]` / `lora_b [out, rank]`), put rows in
front: `rules=((r"lora_a$", (None, "fsdp")), (r"lora_b$", ("fsdp", None)), *RULES)`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TypedDict, TypeGuard, TypeVar

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec
from jax.tree_util import PyTreeDef
from jaxtyping import PyTree

from zoo.distributed.mesh import axis_size, mesh_string
from zoo.nn.feedforward import FeedForward
from zoo.nn.moe import MoEFeedForward
from zoo.nn.multihead import MultiHeadAttention
from zoo.tree import path_name

Part = TypeVar("Part")

Spec = tuple[str | None, ...]
Rule = tuple[str, Spec]

RULES: tuple[Rule, ...] = (
    # attention: query/key/value [heads * head_dim, d_model], output [d_model, heads * head_dim]
    (r"(query|key|value)_proj\.weight$", ("tensor", "fsdp")),
    (r"(query|key|value)_proj\.bias$", ("tensor",)),
    (r"attention\.output_proj\.weight$", ("fsdp", "tensor")),
    (r"attention\.output_proj\.bias$", ("fsdp",)),
    # QK-norm over one head's width [head_dim]
    (r"(query|key)_norm\.(weight|bias)$", (None,)),
    # mixture of experts: the stacked experts gate/up [experts, d_model, d_ff] and down
    # [experts, d_ff, d_model] split by expert over `expert`; the router [experts, d_model], the
    # shared expert (a gated feed-forward) and its gate [1, d_model]
    # (also wrapped by `zoo.lora`: int8 is `.weight` plus a scale per expert and output column,
    # LoRA is `.base` plus `lora_a` [experts, in, rank] and `lora_b` [experts, rank, out]; each
    # device keeps its experts' adapters and scales beside their weights)
    (r"feed_forward\.experts\.(gate|up)(\.base)?(\.weight)?$", ("expert", "fsdp", "tensor")),
    (r"feed_forward\.experts\.down(\.base)?(\.weight)?$", ("expert", "tensor", "fsdp")),
    (r"feed_forward\.experts\.(gate|up|down)(\.base)?\.scale$", ("expert", None)),
    (r"feed_forward\.experts\.(gate|up|down)\.lora_[ab]$", ("expert", None, None)),
    (r"feed_forward\.(router|shared_gate)\.weight$", (None, "fsdp")),
    (r"feed_forward\.selection_bias$", (None,)),
    (r"feed_forward\.shared\.(gate|hidden)\.weight$", ("tensor", "fsdp")),
    (r"feed_forward\.shared\.output\.weight$", ("fsdp", "tensor")),
    # feed-forward, dense or gated: gate/hidden [d_ff, d_model], output [d_model, d_ff]
    (r"feed_forward\.(gate|hidden)\.weight$", ("tensor", "fsdp")),
    (r"feed_forward\.(gate|hidden)\.bias$", ("tensor",)),
    (r"feed_forward\.output\.weight$", ("fsdp", "tensor")),
    (r"feed_forward\.output\.bias$", ("fsdp",)),
    # LayerNorm and RMSNorm [d_model]
    (r"norm\.(weight|bias)$", ("fsdp",)),
    # embeddings: tokens [vocab, d_model]; learned positions and segments [rows, d_model]
    (r"token_weight$", ("tensor", "fsdp")),
    (r"(position|token_type)_weight$", (None, "fsdp")),
    # output heads: an untied LM or translation head [vocab, d_model], a classifier's
    # [classes, d_model], the pooler [d_model, d_model]
    (r"(^|\.)(head|output_proj)\.weight$", ("tensor", "fsdp")),
    (r"(^|\.)(head\.bias|output_bias)$", ("tensor",)),
    (r"(^|\.)pooler\.weight$", (None, "fsdp")),
    (r"(^|\.)pooler\.bias$", (None,)),
)


@lru_cache(maxsize=4096)
def _rule_for(name: str, rules: tuple[Rule, ...]) -> Rule | None:
    for rule in rules:
        if re.search(rule[0], name):
            return rule
    return None


def match_rule(name: str, rules: tuple[Rule, ...] = RULES) -> Rule | None:
    """The first rule whose pattern is found in `name`, or None."""
    return _rule_for(name, tuple(rules))


def partition_spec(
    name: str, shape: tuple[int, ...], mesh: Mesh | AbstractMesh, rules: tuple[Rule, ...] = RULES
) -> PartitionSpec:
    """How the array `name` of `shape` is split over `mesh` (`PartitionSpec()`: kept whole)."""
    rule = match_rule(name, rules)
    if rule is None or len(shape) not in (len(rule[1]), len(rule[1]) + 1):
        return PartitionSpec()
    spec = (None,) * (len(shape) - len(rule[1])) + tuple(rule[1])
    axes = []
    for size, axis in zip(shape, spec, strict=True):
        count = 1 if axis is None else axis_size(mesh, axis)
        axes.append(axis if count > 1 and size % count == 0 else None)
    while axes and axes[-1] is None:
        axes.pop()
    return PartitionSpec(*axes)


def _flat_slots(tree: PyTree) -> tuple[list[tuple[str, object]], PyTreeDef]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(path_name(path), leaf) for path, leaf in flat], treedef


def _is_slot(leaf: object) -> TypeGuard[jax.Array | jax.ShapeDtypeStruct | np.ndarray]:
    """Whether `leaf` is an array (or an array's shape and dtype) that rules place."""
    return isinstance(leaf, jax.Array | jax.ShapeDtypeStruct | np.ndarray)


def _parts(tree: PyTree, kind: type[Part]) -> list[Part]:
    """The modules of class `kind` in `tree` (a model, or a pytree of its shape)."""
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=lambda node: isinstance(node, kind))
    return [node for node in nodes if isinstance(node, kind)]


def check_tensor(tree: PyTree, mesh: Mesh | AbstractMesh) -> None:
    """`tensor` must divide the heads, key/value heads and feed-forward widths of `tree`."""
    tensor = axis_size(mesh, "tensor")
    if tensor == 1:
        return
    sizes: dict[str, int] = {}
    for attention in _parts(tree, MultiHeadAttention):
        sizes.setdefault("num_heads", attention.num_heads)
        sizes.setdefault("num_kv_heads", attention.num_kv_heads)
    for feed_forward in _parts(tree, FeedForward):
        sizes.setdefault("d_ff", feed_forward.d_ff)
    wrong = [f"{name}={size}" for name, size in sizes.items() if size % tensor]
    if wrong:
        divisors = [t for t in range(1, tensor + 1) if all(s % t == 0 for s in sizes.values())]
        raise ValueError(
            f"mesh {mesh_string(mesh)}: tensor={tensor} must divide the model's heads, "
            f"key/value heads and feed-forward width, but {', '.join(wrong)} is not divisible "
            f"by {tensor}; choose tensor among {divisors} (put the other devices on data or "
            "fsdp)"
        )


def check_experts(tree: PyTree, mesh: Mesh | AbstractMesh) -> None:
    """`expert` must divide the experts of `tree` (and the model must have some)."""
    expert = axis_size(mesh, "expert")
    if expert == 1:
        return
    counts = {mixture.num_experts for mixture in _parts(tree, MoEFeedForward)}
    wrong = sorted(count for count in counts if count % expert)
    if not counts or wrong:
        have = f"{wrong[0]} experts" if wrong else "no experts"
        raise ValueError(
            f"mesh {mesh_string(mesh)}: expert={expert} splits a mixture of experts' experts "
            f"over devices, but the model has {have}; choose expert among the divisors of "
            "the number of experts, or put the devices on data or fsdp"
        )


def shardings(tree: PyTree, mesh: Mesh | AbstractMesh, rules: tuple[Rule, ...] = RULES) -> PyTree:
    """`tree` (a model, an optimizer state, or their `eqx.filter_eval_shape`) with each array
    replaced by its `NamedSharding` on `mesh` (other leaves kept). Nothing is allocated."""
    check_tensor(tree, mesh)
    check_experts(tree, mesh)
    slots, treedef = _flat_slots(tree)
    leaves = [
        NamedSharding(mesh, partition_spec(name, tuple(leaf.shape), mesh, rules))
        if _is_slot(leaf)
        else leaf
        for name, leaf in slots
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


class ShardingRow(TypedDict):
    """One array of a tree, and how the rules place it on a mesh."""

    name: str  # its dotted pytree path
    shape: tuple[int, ...]
    dtype: str
    spec: PartitionSpec  # the mesh axes that split its dimensions
    rule: bool  # whether a rule matched it (a scalar needs none)
    bytes: int  # in all
    bytes_per_device: int  # of its largest shard


def sharding_table(
    tree: PyTree, mesh: Mesh | AbstractMesh, rules: tuple[Rule, ...] = RULES
) -> list[ShardingRow]:
    """One row per array of `tree`: name, shape, dtype, spec, bytes in all and per device."""
    check_tensor(tree, mesh)
    check_experts(tree, mesh)
    rows: list[ShardingRow] = []
    for name, leaf in _flat_slots(tree)[0]:
        if not _is_slot(leaf):
            continue
        shape = tuple(leaf.shape)
        spec = partition_spec(name, shape, mesh, rules)
        itemsize = np.dtype(leaf.dtype).itemsize
        rows.append(
            {
                "name": name,
                "shape": shape,
                "dtype": str(np.dtype(leaf.dtype)),
                "spec": spec,
                "rule": not shape or match_rule(name, rules) is not None,
                "bytes": int(np.prod(shape, dtype=np.int64)) * itemsize,
                "bytes_per_device": int(
                    np.prod(NamedSharding(mesh, spec).shard_shape(shape), dtype=np.int64)
                )
                * itemsize,
            }
        )
    return rows


def _spec_text(spec: PartitionSpec, ndim: int, matched: bool) -> str:
    if not matched:
        return "whole (no rule)"
    if all(axis is None for axis in spec):
        return "whole"
    axes = [*spec, *([None] * (ndim - len(spec)))]
    return "(" + ", ".join("-" if axis is None else str(axis) for axis in axes) + ")"


def describe(model: PyTree, mesh: Mesh | AbstractMesh, rules: tuple[Rule, ...] = RULES) -> None:
    """Print each parameter's shape, sharding and bytes per device on `mesh`, then the totals.

    `model` may be `eqx.filter_eval_shape(...)` of a model (or of an optimizer state)."""
    rows = sharding_table(model, mesh, rules)
    width = max([len("parameter")] + [len(row["name"]) for row in rows])
    print(f"mesh {mesh_string(mesh)} ({mesh.size} devices)")
    print(f"{'parameter':<{width}}  {'shape':<16} {'split over':<18} {'bytes/device':>14}")
    for row in rows:
        shape = "x".join(str(size) for size in row["shape"]) or "scalar"
        print(
            f"{row['name']:<{width}}  {shape:<16} {_spec_text(row['spec'], len(row['shape']), row['rule']):<18} "
            f"{row['bytes_per_device']:>14,}"
        )
    total = sum(row["bytes"] for row in rows)
    per_device = sum(row["bytes_per_device"] for row in rows)
    share = per_device / total if total else 0.0
    print(f"total {total:,} bytes; {per_device:,} per device ({share:.1%})")
