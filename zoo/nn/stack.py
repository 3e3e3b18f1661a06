"""The blocks of a `LayerPlan`, built once with `filter_vmap` and run scanned or unrolled.

The blocks' arrays carry a leading `layers` axis. Scanning over it (`lax.scan`) compiles one
layer's graph whatever the depth; unrolling writes one graph per layer: slower to compile, but
on a GPU XLA then fuses across layers and keeps no stacked copy of every layer's activations
(GPT-2 small on an H100, bf16: 344k tokens/s unrolled against 257k scanned, compiled in 25 s
against 13 s). `scan=None`, the default, chooses by the platform the program is traced for:
unrolled on a GPU, scanned elsewhere (on a CPU the scan is as fast and compiles faster).

Layers whose weights differ in shape (dense feed-forward layers among experts, ModernBERT's
layer 0 without a norm before its attention) go in groups: each group stacks the layers of one
kind (`blocks` is the one group, paths `layers.blocks.self_attention...`, or a tuple of them,
paths `layers.blocks.0...`). Layers that differ only in their call (`LayerCall`: Gemma's local
and global layers, with their window and rotary base) share a group. The stack runs the plan's
layers in order, each consecutive run of one group's layers as one scan (or unrolled); a
scanned layer picks its call with `lax.switch`, so each call keeps its window static and a
fused kernel gets it as its own `local_window_size`. `LayerIndex` says which layer each stacked
row is: what saved weights, adapters and freezing name by layer number.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.block import BlockExtras, BlockInputs, CrossInputs, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.layer_loop import REMAT_CHOICES, LayerArrays, loop_layers, remat_policy, scans
from zoo.nn.linear import Init
from zoo.nn.lora import with_dropout_keys
from zoo.nn.mask import Mask
from zoo.nn.plan import LayerCall, LayerPlan, weights_of
from zoo.nn.rotary import RotaryEmbedding, RotaryTable


class Run(NamedTuple):
    """Consecutive layers `[start, stop)`, rows `[row, row + stop - start)` of group `group`."""

    group: int
    row: int
    start: int
    stop: int


class LayerStack(eqx.Module):
    """The layers of a `LayerPlan` applied in sequence to one example; batch with `jax.vmap`."""

    blocks: TransformerBlock | tuple[TransformerBlock, ...]  # one group, or one per kind
    num_layers: int = eqx.field(static=True)
    scan: bool | None = eqx.field(static=True)
    remat: str | None = eqx.field(static=True)
    group_of: tuple[int, ...] = eqx.field(static=True)  # each layer's group
    calls: tuple[LayerCall, ...] = eqx.field(static=True)  # the plan's distinct calls
    call_of: tuple[int, ...] = eqx.field(static=True)  # each layer's call

    def __init__(
        self,
        plan: LayerPlan,
        d_model: int,
        *,
        init: Init | None = None,
        scan: bool | None = None,
        remat: str | None = None,
        key: PRNGKeyArray,
    ):
        """The blocks of `plan`, `d_model` wide, drawn as `init` says (one key per layer);
        `scan` True scans the layers, False unrolls them, None chooses by platform; `remat`
        is what the backward pass recomputes (`REMAT_CHOICES`)."""
        if remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {remat!r}")
        layers = plan.layers()
        kinds = list(dict.fromkeys(weights_of(settings) for settings in layers))
        calls = list(dict.fromkeys(LayerCall.of(settings) for settings in layers))
        self.group_of = tuple(kinds.index(weights_of(settings)) for settings in layers)
        self.calls = tuple(calls)
        self.call_of = tuple(calls.index(LayerCall.of(settings)) for settings in layers)
        keys = jax.random.split(key, plan.num_layers)
        groups = []
        for group in range(len(kinds)):
            rows = self.group_layers(group)
            settings = layers[rows[0]]  # the group's statics: its first layer's call

            def make(layer_key, settings=settings):
                return TransformerBlock(d_model, settings, init=init, key=layer_key)

            groups.append(eqx.filter_vmap(make)(keys[np.asarray(rows)]))
        self.blocks = groups[0] if len(groups) == 1 else tuple(groups)
        self.num_layers = plan.num_layers
        self.scan = scan
        self.remat = remat

    @property
    def groups(self) -> tuple[TransformerBlock, ...]:
        """The stacked blocks of each kind (one group for a stack of alike layers)."""
        return self.blocks if isinstance(self.blocks, tuple) else (self.blocks,)

    def group_layers(self, group: int) -> tuple[int, ...]:
        """The layer indices of `group`'s rows, in order."""
        return tuple(i for i, g in enumerate(self.group_of) if g == group)

    def runs(self) -> tuple[Run, ...]:
        """The consecutive runs of one group's layers, first to last."""
        runs: list[Run] = []
        for layer, group in enumerate(self.group_of):
            if runs and runs[-1].group == group:
                runs[-1] = runs[-1]._replace(stop=layer + 1)
            else:
                runs.append(Run(group, self.group_of[:layer].count(group), layer, layer + 1))
        return tuple(runs)

    def layer(self, index: int) -> TransformerBlock:
        """Block number `index` as a standalone module, called as that layer is."""
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} is not a layer of a {self.num_layers}-layer stack")
        group = self.group_of[index]
        params, static = eqx.partition(self.groups[group], eqx.is_array)
        row = self.group_of[:index].count(group)
        block = eqx.combine(jax.tree_util.tree_map(lambda a: a[row], params), static)
        return block.with_call(**self.calls[self.call_of[index]]._asdict())

    def cross_inputs(
        self, memory: Float[Array, "src d_model"], mask: Mask | None = None
    ) -> CrossInputs:
        """Every layer's cross-attention keys and values of `memory`
        (`[layers, src, kv_heads, head_dim]`), with the `mask` over them."""

        def project(block: TransformerBlock):
            if block.cross_attention is None:
                raise ValueError("these blocks have no cross-attention")
            return block.cross_attention.project_key_value(memory)

        projected = [eqx.filter_vmap(project)(group) for group in self.groups]
        if len(projected) == 1:
            keys, values = projected[0]
            return CrossInputs(keys, values, mask)
        order = np.argsort(np.concatenate([self.group_layers(g) for g in range(len(projected))]))
        keys, values = (jnp.concatenate(parts)[order] for parts in zip(*projected, strict=True))
        return CrossInputs(keys, values, mask)

    def init_cache(self, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty self-attention cache for every layer: `[layers, max_len, kv_heads, head_dim]`.

        It stores the key/value heads only (fewer than the query heads under grouped-query
        attention), so one cached token takes
        `2 * layers * kv_heads * head_dim * dtype.itemsize` bytes (keys and values).
        """
        attention = self.groups[0].self_attention
        return KVCache.empty(
            max_len, attention.num_kv_heads, attention.head_dim, dtype, layers=self.num_layers
        )

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        inputs: BlockInputs | None = None,
        *,
        key: PRNGKeyArray | None = None,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], BlockExtras]:
        """Run every layer. Extras (cache, attention weights) come back stacked on `layers`
        (router statistics on the mixture-of-experts layers only).

        `inputs` (`BlockInputs`) are the same for every layer, except that `cross` and `cache`
        hold every layer's, stacked on `layers`. The rotary table of the positions is made
        here, once per rotary base, outside the layer loop, and handed to its layers.
        """
        inputs = BlockInputs() if inputs is None else inputs
        shared = self._call_inputs(inputs, x.shape[0])
        layer_keys = None if key is None else jax.random.split(key, self.num_layers)
        cross = inputs.cross
        stacked_cross = None if cross is None else (cross.keys, cross.values)
        cross_mask = None if cross is None else cross.mask
        scan, policy = scans(self.scan), remat_policy(self.remat)
        if inputs.cache is not None:  # decoding is never differentiated: nothing to recompute
            policy = None
        carry: tuple[Array, KVCache | None] = (x, inputs.cache)
        extras = []
        for run in self.runs():
            layers = range(run.start, run.stop)
            run_calls = tuple(dict.fromkeys(self.call_of[i] for i in layers))
            params, static = eqx.partition(self.groups[run.group], eqx.is_array)
            step = functools.partial(
                _layer_step,
                static=static,
                calls=tuple((self.calls[c], shared[c]) for c in run_calls),
                cross_mask=cross_mask,
                return_weights=return_weights,
            )
            arrays: LayerArrays = (
                _rows(params, run.row, len(layers)),
                _rows(layer_keys, run.start, len(layers)),
                _rows(stacked_cross, run.start, len(layers)),
            )
            calls = [run_calls.index(self.call_of[i]) for i in layers]
            carry, extra = loop_layers(
                step, carry, arrays, run.start, calls, scan=scan, policy=policy
            )
            extras.append(extra)
        x, cache = carry
        return x, _joined(extras)._replace(cache=cache)

    def _call_inputs(self, inputs: BlockInputs, length: int) -> tuple[BlockInputs, ...]:
        """The inputs every layer of each call shares: its rotary table (none without rotary
        positions), without the per-layer cross inputs and cache."""
        shared = inputs._replace(cross=None, cache=None)
        ropes = {call.rope for call in self.calls if call.rope is not None}
        if inputs.rotary is not None:
            if len(ropes) > 1:
                raise ValueError(
                    "these layers rotate by several bases: pass positions, not a table"
                )
            return tuple(
                shared if call.rope is not None else shared._replace(rotary=None)
                for call in self.calls
            )
        positions = inputs.positions
        if positions is None:
            offset = 0 if inputs.cache is None else inputs.cache.index
            positions = offset + jnp.arange(length)
        head_dim = self.groups[0].self_attention.head_dim
        tables: dict[object, RotaryTable] = {
            rope: RotaryEmbedding(head_dim, rope).table(positions) for rope in ropes
        }
        return tuple(
            shared._replace(rotary=None if call.rope is None else tables[call.rope])
            for call in self.calls
        )


def _layer_step(
    carry: tuple[Array, KVCache | None],
    per_layer: LayerArrays,
    *,
    layer: Array | int,
    call: Array | int,
    static: TransformerBlock,
    calls: tuple[tuple[LayerCall, BlockInputs], ...],
    cross_mask: Mask | None,
    return_weights: bool,
) -> tuple[tuple[Array, KVCache | None], BlockExtras]:
    """One layer: its block (weights `per_layer[0]` on the group's `static` parts) called as
    `calls[call]` says, reading and writing row `layer` of a stacked cache."""
    h, cache = carry
    params, layer_key, layer_cross = per_layer
    block = with_dropout_keys(eqx.combine(params, static), layer_key)  # LoRA's, where it drops
    cross = None if layer_cross is None else CrossInputs(*layer_cross, cross_mask)
    layer_cache = None if cache is None else cache.layer(layer)

    def run(index: int) -> tuple[Array, BlockExtras]:
        layer_call, shared = calls[index]
        called = block.with_call(window=layer_call.window, rope=layer_call.rope)
        layer_inputs = shared._replace(cross=cross, cache=layer_cache)
        return called(h, layer_inputs, key=layer_key, return_weights=return_weights)

    if len(calls) == 1 or isinstance(call, int):
        h, extra = run(call if isinstance(call, int) else 0)
    else:
        h, extra = jax.lax.switch(call, [functools.partial(run, i) for i in range(len(calls))])
    if cache is not None and extra.cache is not None:
        keys = cache.keys.at[layer].set(extra.cache.keys)
        values = cache.values.at[layer].set(extra.cache.values)
        cache = KVCache(keys, values, cache.index)
    return (h, cache), extra._replace(cache=None)


def _rows(tree, start: int, size: int):
    """Rows `[start, start + size)` of arrays stacked on a leading axis (the whole arrays when
    that is all of them; None stays None)."""
    if tree is None:
        return None
    leaves = jax.tree_util.tree_leaves(tree)
    if start == 0 and leaves and size == leaves[0].shape[0]:
        return tree
    return jax.tree_util.tree_map(lambda a: a[start : start + size], tree)


def _joined(extras: list[BlockExtras]) -> BlockExtras:
    """The extras of consecutive runs as one: weights joined on `layers`, the router
    statistics of the runs that route."""
    if len(extras) == 1:
        return extras[0]

    def join(parts):
        present = [p for p in parts if p is not None]
        if not present:
            return None
        return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *present)

    return BlockExtras(
        cache=None,
        self_weights=join([e.self_weights for e in extras]),
        cross_weights=join([e.cross_weights for e in extras]),
        router=join([e.router for e in extras]),
    )
