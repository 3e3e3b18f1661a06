"""Transformer blocks, built once with `filter_vmap` and run scanned or unrolled.

The blocks' arrays carry a leading `layers` axis. Scanning over it (`lax.scan`) compiles one
layer's graph whatever the depth; unrolling writes one graph per layer: slower to compile, but
on a GPU XLA then fuses across layers and keeps no stacked copy of every layer's activations
(GPT-2 small on an H100, bf16: 344k tokens/s unrolled against 257k scanned, compiled in 25 s
against 13 s). `scan=None`, the default, chooses by the platform the program is traced for:
unrolled on a GPU, scanned elsewhere (on a CPU the scan is as fast and compiles faster).

Layers of different shapes (dense feed-forward layers among mixture-of-experts ones, Qwen's
`mlp_only_layers` and DeepSeek's leading dense layers; ModernBERT's first layer, which has no
norm before its attention) go in groups: each group stacks the layers of one kind, and the stack
applies the layers in their order, each consecutive run of one group's layers as one scan (or
unrolled). A stack of one kind is one group, `blocks`, as it always was (paths
`layers.blocks.self_attention...`); with several kinds `blocks` is a tuple of groups (paths
`layers.blocks.0.feed_forward...`), and `layer(i)` and the stacked extras (cache, attention
weights) stay in layer order. An alternating stack (`decoder_sparse_step=2`) runs one layer per
run: it compiles like an unrolled one.

Local and global layers (Gemma 2/3: a sliding window on most layers, full attention on every
second or sixth, each kind with its own rotary base) are one stack too: a `LayerPattern` names
the global layers. The kind of a layer is data beside its weights: a scanned stack switches on
it with `lax.cond` between two calls of the same block, one with the windowed mask and the
local rotary table, one without the window; an unrolled stack knows each layer's kind while
tracing. Either way each call's mask keeps its window as a static size, so a fused kernel gets
it as its own `local_window_size`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.block import BlockExtras, BlockInputs, CrossInputs, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.kernel import current_platform
from zoo.nn.mask import Mask
from zoo.nn.rotary import Rope, RotaryEmbedding
from zoo.tree import path_name

# What the backward pass recomputes instead of keeping (`jax.checkpoint` policies per layer):
# None keeps every intermediate; "dots" keeps the matrix products and recomputes the cheap
# elementwise work (norms, activations, softmax); "full" keeps only each layer's input;
# "auto" is "dots" in a program traced for a CPU (where keeping fewer stacked activations
# measured faster: benchmarks/cpu_train_speed.py) and None elsewhere.
REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.dots_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
REMAT_CHOICES = (None, *REMAT_POLICIES, "auto")


def remat_policy(remat: str | None) -> str | None:
    """The policy (`REMAT_POLICIES` key, or None) a stack built with `remat` uses when traced
    now: "auto" chooses by the platform, as `scans` does."""
    if remat == "auto":
        return "dots" if current_platform() == "cpu" else None
    return remat


LAYER_LOOPS = ("auto", "scan", "unroll")  # a config's `layer_loop`: `scan` None, True, False

BlockMaker = Callable[[PRNGKeyArray], TransformerBlock]


@dataclass(frozen=True, kw_only=True)
class LayerPattern:
    """Which layers of a stack attend globally, the rest through the model's window.

    The model's mask carries the window (a config's `sliding_window`); the global layers run
    with the window taken off. `local_rope` rotates the windowed layers' queries and keys
    (Gemma 3's `rope_local_base_freq`); None: the attention's own rotary settings.
    """

    global_layers: tuple[int, ...]  # indices of the layers without the window
    local_rope: Rope | None = None  # the windowed layers' rotary settings

    def is_global(self, num_layers: int) -> tuple[bool, ...]:
        """Each layer's kind, first to last (True: global)."""
        outside = [i for i in self.global_layers if not 0 <= i < num_layers]
        if outside:
            raise ValueError(
                f"global_layers {outside} are not layers of a {num_layers}-layer stack"
            )
        return tuple(i in self.global_layers for i in range(num_layers))


@dataclass(frozen=True)
class Run:
    """Consecutive layers `[start, stop)` of the stack, rows `[row, row + stop - start)` of
    group `group`'s stacked blocks."""

    group: int
    row: int
    start: int
    stop: int


def scans(scan: bool | None) -> bool:
    """Whether a stack built with `scan` runs its layers with `lax.scan` when traced now: an
    explicit choice, else unrolled on a GPU and scanned elsewhere (the module docstring)."""
    if scan is not None:
        return scan
    return current_platform() != "gpu"


class LayerStack(eqx.Module):
    """`num_layers` blocks applied in sequence to one example; batch with `jax.vmap`."""

    blocks: TransformerBlock | tuple[TransformerBlock, ...]  # one group, or one per kind
    num_layers: int = eqx.field(static=True)
    scan: bool | None = eqx.field(static=True)
    remat: str | None = eqx.field(static=True)
    pattern: LayerPattern | None = eqx.field(static=True, default=None)
    group_of: tuple[int, ...] = eqx.field(static=True, default=())  # each layer's group

    def __init__(
        self,
        make_block: BlockMaker | Sequence[BlockMaker],
        num_layers: int,
        *,
        layer_kinds: Sequence[int] | None = None,
        scan: bool | None = None,
        remat: str | None = None,
        pattern: LayerPattern | None = None,
        key: PRNGKeyArray,
    ):
        """A stack of `num_layers` blocks.

        Args:
            make_block: builds one block from its key (vmapped into the stacked blocks); or
                one such builder per kind of layer, with `layer_kinds`.
            num_layers: how many blocks.
            layer_kinds: each layer's kind, an index into `make_block` (every kind used);
                None: one kind.
            scan: True scans the layers, False unrolls them, None chooses by platform.
            remat: what the backward pass recomputes (`REMAT_CHOICES`).
            pattern: makes some layers global and the rest local (see `LayerPattern`).
            key: the blocks' random key (one per layer, whatever its group).
        """
        if remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {remat!r}")
        if pattern is not None:
            pattern.is_global(num_layers)  # check the indices now
        makers = [make_block] if callable(make_block) else list(make_block)
        kinds = tuple([0] * num_layers if layer_kinds is None else layer_kinds)
        if len(kinds) != num_layers or set(kinds) != set(range(len(makers))):
            raise ValueError(
                f"layer_kinds must give each of the {num_layers} layers a kind in "
                f"0..{len(makers) - 1}, using every kind; got {list(kinds)}"
            )
        keys = jax.random.split(key, num_layers)
        groups = tuple(
            eqx.filter_vmap(maker)(keys[np.asarray(_layers_of(kinds, kind))])
            for kind, maker in enumerate(makers)
        )
        self.blocks = groups[0] if len(groups) == 1 else groups
        self.num_layers = num_layers
        self.scan = scan
        self.remat = remat
        self.pattern = pattern
        self.group_of = kinds

    @property
    def groups(self) -> tuple[TransformerBlock, ...]:
        """The stacked blocks of each kind (one group for a stack of alike layers)."""
        return self.blocks if isinstance(self.blocks, tuple) else (self.blocks,)

    def group_layers(self, group: int) -> tuple[int, ...]:
        """The layer indices of `group`'s rows, in order."""
        return _layers_of(self.group_of, group)

    def runs(self) -> tuple[Run, ...]:
        """The consecutive runs of one group's layers, first to last."""
        runs: list[Run] = []
        for layer, group in enumerate(self.group_of):
            if runs and runs[-1].group == group:
                last = runs[-1]
                runs[-1] = Run(group, last.row, last.start, layer + 1)
            else:
                row = self.group_of[:layer].count(group)
                runs.append(Run(group, row, layer, layer + 1))
        return tuple(runs)

    def layer(self, index: int) -> TransformerBlock:
        """Block number `index` as a standalone module (for inspection and weight conversion)."""
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} is not a layer of a {self.num_layers}-layer stack")
        group = self.group_of[index]
        params, static = eqx.partition(self.groups[group], eqx.is_array)
        row = self.group_of[:index].count(group)
        return eqx.combine(jax.tree_util.tree_map(lambda a: a[row], params), static)

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
        keys, values = jax.tree_util.tree_map(lambda *a: self._in_layer_order(a), *projected)
        return CrossInputs(keys, values, mask)

    def _in_layer_order(self, per_group: Sequence[Array]) -> Array:
        """Arrays stacked on each group's rows, as one array stacked in layer order."""
        if len(per_group) == 1:
            return per_group[0]
        layers = np.concatenate([self.group_layers(g) for g in range(len(per_group))])
        return jnp.concatenate(per_group)[np.argsort(layers)]

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
        hold every layer's, stacked on `layers`. With rotary attention the cos/sin table of the
        positions is made here, once, outside the layer loop, and handed to every layer.
        """
        inputs = BlockInputs() if inputs is None else inputs
        local = self._local_rotary(inputs, x.shape[0])
        inputs = inputs.with_rotary(self.groups[0].self_attention, x.shape[0])
        layer_keys = None if key is None else jax.random.split(key, self.num_layers)
        cross = inputs.cross
        shared = inputs._replace(cross=None, cache=None)  # the per-layer parts go in per_layer
        cross_mask = None if cross is None else cross.mask
        kinds = self._kinds(shared, local)
        scan = scans(self.scan)
        stacked_cross = None if cross is None else (cross.keys, cross.values)
        flags = self._flags(scan)
        cache = inputs.cache
        extras = []
        for run in self.runs():
            params, static = eqx.partition(self.groups[run.group], eqx.is_array)
            size = run.stop - run.start
            params = _rows(params, run.row, size)
            per_layer = (
                params,
                _rows(layer_keys, run.start, size, self.num_layers),
                _rows(stacked_cross, run.start, size, self.num_layers),
            )
            run_flags = None if flags is None else flags[run.start : run.stop]
            body = _layer_body(static, shared, kinds, cross_mask, return_weights)
            if cache is not None:
                loop = self._scan_with_cache if scan else self._unroll_with_cache
                x, extra = loop(body, x, per_layer, cache, run_flags, run.start)
                cache = extra.cache
            else:
                x, extra = self._run_layers(body, x, per_layer, run_flags, scan)
            extras.append(extra)
        return x, _joined(extras)

    def _run_layers(self, body, x, per_layer, flags, scan: bool):
        """One run of layers without a cache, scanned or unrolled, each under `remat`."""

        policy = remat_policy(self.remat)

        def remat(function):
            if policy is None:
                return function
            return jax.checkpoint(function, policy=REMAT_POLICIES[policy])

        params, layer_keys, stacked_cross = per_layer
        if scan:
            return jax.lax.scan(remat(body), x, (params, layer_keys, None, stacked_cross, flags))
        extras = []
        for index in range(jax.tree_util.tree_leaves(params)[0].shape[0]):
            params_i, key_i, cross_i = _layer_slice(per_layer, index)
            layer_body = functools.partial(body, is_global=_flag(flags, index))
            x, extra = remat(layer_body)(x, (params_i, key_i, None, cross_i))
            extras.append(extra)
        return x, _stacked(extras)

    def _flags(self, scan: bool) -> Array | tuple[bool, ...] | None:
        """Each layer's kind (True: global): an array to scan over, or a tuple to unroll."""
        if self.pattern is None:
            return None
        flags = self.pattern.is_global(self.num_layers)
        return jnp.asarray(flags) if scan else flags

    def _local_rotary(self, inputs: BlockInputs, length: int) -> BlockInputs | None:
        """The inputs of the local layers' rotary table (None: the same as the global ones)."""
        attention = self.groups[0].self_attention
        pattern = self.pattern
        if pattern is None or pattern.local_rope is None or attention.rotary is None:
            return None
        if inputs.rotary is not None:
            raise ValueError(
                "local layers rotate by their own base: pass positions, not a rotary table"
            )
        offset = 0 if inputs.cache is None else inputs.cache.index
        positions = inputs.positions
        if positions is None:
            positions = offset + jnp.arange(length)
        table = RotaryEmbedding(attention.head_dim, pattern.local_rope).table(positions)
        return inputs._replace(rotary=table)

    def _kinds(
        self, shared: BlockInputs, local: BlockInputs | None
    ) -> tuple[BlockInputs, BlockInputs] | None:
        """(local, global) inputs of a stack with a `LayerPattern`: the local layers keep the
        window and get their own rotary table; the global layers drop the window."""
        if self.pattern is None:
            return None
        local_inputs = shared if local is None else shared._replace(rotary=local.rotary)
        mask = shared.mask
        global_mask = None if mask is None else mask.replace(window=None)
        return local_inputs, shared._replace(mask=global_mask)

    def _scan_with_cache(self, body, x, per_layer, cache: KVCache, flags=None, start: int = 0):
        """The scan for incremental decoding: the cache rides in the carry, not in `xs`/`ys`.

        As a scanned input and output the whole cache would be rewritten at every decoding step
        (and, under vmap, transposed); in the carry each layer updates its slice in place. The
        run's first layer is layer `start` of the stack (and of the cache).
        """

        def cached_body(carry, layer_inputs):
            h, keys, values, layer = carry
            (block_params, layer_key, layer_cross), flag = layer_inputs
            layer_cache = KVCache(keys[layer], values[layer], cache.index)
            kind = () if flags is None else (flag,)  # a layer's kind, with a `LayerPattern`
            h, extra = body(h, (block_params, layer_key, layer_cache, layer_cross, *kind))
            assert extra.cache is not None
            keys = keys.at[layer].set(extra.cache.keys)
            values = values.at[layer].set(extra.cache.values)
            return (h, keys, values, layer + 1), extra._replace(cache=None)

        first = jnp.asarray(start, jnp.int32)
        carry = (x, cache.keys, cache.values, first)
        (x, keys, values, _), extras = jax.lax.scan(cached_body, carry, (per_layer, flags))
        return x, extras._replace(cache=KVCache(keys, values, cache.index))

    def _unroll_with_cache(self, body, x, per_layer, cache: KVCache, flags=None, start: int = 0):
        """Incremental decoding, unrolled: each layer writes its slice of the stacked cache in
        place, as the scan's carry does, rather than the slices being stacked anew."""
        keys, values = cache.keys, cache.values
        extras = []
        for index in range(jax.tree_util.tree_leaves(per_layer[0])[0].shape[0]):
            block_params, layer_key, layer_cross = _layer_slice(per_layer, index)
            layer = start + index
            layer_cache = KVCache(keys[layer], values[layer], cache.index)
            flag = _flag(flags, index)
            x, extra = body(x, (block_params, layer_key, layer_cache, layer_cross), flag)
            assert extra.cache is not None
            keys = keys.at[layer].set(extra.cache.keys)
            values = values.at[layer].set(extra.cache.values)
            extras.append(extra._replace(cache=None))
        return x, _stacked(extras)._replace(cache=KVCache(keys, values, cache.index))


def _layer_body(static, shared: BlockInputs, kinds, cross_mask, return_weights: bool):
    """One layer of a group whose non-array parts are `static`: `body(h, per_layer)` with
    per_layer = (params, key, cache, cross keys/values[, global flag]); its kind is
    `is_global` (known while tracing) or, scanned, the flag after its other inputs."""

    def body(h, per_layer, is_global: bool | None = None):
        block_params, layer_key, layer_cache, layer_cross = per_layer[:4]
        block = eqx.combine(block_params, static)
        if layer_cross is not None:
            cross_keys, cross_values = layer_cross
            layer_cross = CrossInputs(cross_keys, cross_values, cross_mask)

        def run(kind_inputs: BlockInputs):
            layer_inputs = kind_inputs._replace(cross=layer_cross, cache=layer_cache)
            return block(h, layer_inputs, key=layer_key, return_weights=return_weights)

        if kinds is None:
            return run(shared)
        if is_global is not None:
            return run(kinds[1] if is_global else kinds[0])
        return jax.lax.cond(per_layer[4], lambda: run(kinds[1]), lambda: run(kinds[0]))

    return body


def _layers_of(group_of: Sequence[int], group: int) -> tuple[int, ...]:
    return tuple(i for i, g in enumerate(group_of) if g == group)


def _rows(tree, start: int, size: int, total: int | None = None):
    """Rows `[start, start + size)` of arrays stacked on a leading axis (the whole arrays when
    that is all of them; None stays None)."""
    if tree is None:
        return None
    leaves = jax.tree_util.tree_leaves(tree)
    total = leaves[0].shape[0] if total is None and leaves else total
    if start == 0 and size == total:
        return tree
    return jax.tree_util.tree_map(lambda a: a[start : start + size], tree)


def _flag(flags: Array | tuple[bool, ...] | None, index: int) -> bool | None:
    """Layer `index`'s kind in an unrolled stack (the flags are a tuple there)."""
    return None if flags is None else bool(flags[index])


def _layer_slice(per_layer, index: int):
    """Layer `index` of arrays stacked on a leading `layers` axis (None stays None)."""
    return jax.tree_util.tree_map(lambda a: a[index], per_layer)


def _stacked(extras: list[BlockExtras]) -> BlockExtras:
    """Per-layer extras stacked on a leading `layers` axis, as `lax.scan` returns them."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *extras)


def _joined(extras: list[BlockExtras]) -> BlockExtras:
    """The extras of consecutive runs as one: weights joined on `layers`, the last run's cache
    (it holds every layer's), the router statistics of the runs that route."""
    if len(extras) == 1:
        return extras[0]

    def join(parts):
        present = [p for p in parts if p is not None]
        if not present:
            return None
        return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *present)

    return BlockExtras(
        cache=extras[-1].cache,
        self_weights=join([e.self_weights for e in extras]),
        cross_weights=join([e.cross_weights for e in extras]),
        router=join([e.router for e in extras]),
    )


STACK_FIELD = "blocks"  # LayerStack.blocks: arrays with a leading `layers` axis


def stack_groups(tree: object) -> dict[str, tuple[tuple[int, ...], ...]]:
    """`<stack path>.blocks` -> the layer indices of each group's rows, for every stack of
    `tree` (a model, or a pytree of its shape: its arrays, its gradients) that holds several
    kinds of layer. A stack of alike layers is absent: its rows are its layers."""
    found, _ = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda node: isinstance(node, LayerStack)
    )
    return {
        f"{path_name(path)}.{STACK_FIELD}".lstrip("."): tuple(
            stack.group_layers(g) for g in range(len(stack.groups))
        )
        for path, stack in found
        if isinstance(stack, LayerStack) and isinstance(stack.blocks, tuple)
    }
