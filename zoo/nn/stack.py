"""N identical transformer blocks, built once with `filter_vmap`, run scanned or unrolled.

The blocks' arrays carry a leading `layers` axis. Scanning over it (`lax.scan`) compiles one
layer's graph whatever the depth; unrolling writes one graph per layer: slower to compile, but
on a GPU XLA then fuses across layers and keeps no stacked copy of every layer's activations
(GPT-2 small on an H100, bf16: 344k tokens/s unrolled against 257k scanned, compiled in 25 s
against 13 s). `scan=None`, the default, chooses by the platform the program is traced for:
unrolled on a GPU, scanned elsewhere (on a CPU the scan is as fast and compiles faster).

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
from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from zoo.nn.block import BlockExtras, BlockInputs, CrossInputs, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.kernel import current_platform
from zoo.nn.mask import Mask
from zoo.nn.rotary import Rope, RotaryEmbedding

# What the backward pass recomputes instead of keeping (`jax.checkpoint` policies per layer):
# None keeps every intermediate; "dots" keeps the matrix products and recomputes the cheap
# elementwise work (norms, activations, softmax); "full" keeps only each layer's input.
REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.dots_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
REMAT_CHOICES = (None, *REMAT_POLICIES)
LAYER_LOOPS = ("auto", "scan", "unroll")  # a config's `layer_loop`: `scan` None, True, False


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


def scans(scan: bool | None) -> bool:
    """Whether a stack built with `scan` runs its layers with `lax.scan` when traced now: an
    explicit choice, else unrolled on a GPU and scanned elsewhere (the module docstring)."""
    if scan is not None:
        return scan
    return current_platform() != "gpu"


class LayerStack(eqx.Module):
    """`num_layers` blocks applied in sequence to one example; batch with `jax.vmap`."""

    blocks: TransformerBlock
    num_layers: int = eqx.field(static=True)
    scan: bool | None = eqx.field(static=True)
    remat: str | None = eqx.field(static=True)
    pattern: LayerPattern | None = eqx.field(static=True, default=None)
    # False: the first layer's attention reads the embeddings without its norm (ModernBERT)
    first_attention_norm: bool = eqx.field(static=True, default=True)

    def __init__(
        self,
        make_block: Callable[[PRNGKeyArray], TransformerBlock],
        num_layers: int,
        *,
        scan: bool | None = None,
        remat: str | None = None,
        pattern: LayerPattern | None = None,
        first_attention_norm: bool = True,
        key: PRNGKeyArray,
    ):
        """A stack of `num_layers` blocks.

        Args:
            make_block: builds one block from its key (vmapped into the stacked blocks).
            num_layers: how many blocks.
            scan: True scans the layers, False unrolls them, None chooses by platform.
            remat: what the backward pass recomputes (`REMAT_CHOICES`).
            pattern: makes some layers global and the rest local (see `LayerPattern`).
            first_attention_norm: False skips the norm before the first layer's attention
                (ModernBERT; its weight stays, unused, so that the layers remain alike and
                scannable).
            key: the blocks' random key.
        """
        if remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {remat!r}")
        if pattern is not None:
            pattern.is_global(num_layers)  # check the indices now
        self.blocks = eqx.filter_vmap(make_block)(jax.random.split(key, num_layers))
        self.num_layers = num_layers
        self.scan = scan
        self.remat = remat
        self.pattern = pattern
        self.first_attention_norm = first_attention_norm

    def layer(self, index: int) -> TransformerBlock:
        """Block number `index` as a standalone module (for inspection and weight conversion)."""
        params, static = eqx.partition(self.blocks, eqx.is_array)
        return eqx.combine(jax.tree_util.tree_map(lambda a: a[index], params), static)

    def cross_inputs(
        self, memory: Float[Array, "src d_model"], mask: Mask | None = None
    ) -> CrossInputs:
        """Every layer's cross-attention keys and values of `memory`
        (`[layers, src, kv_heads, head_dim]`), with the `mask` over them."""

        def project(block: TransformerBlock):
            if block.cross_attention is None:
                raise ValueError("these blocks have no cross-attention")
            return block.cross_attention.project_key_value(memory)

        keys, values = eqx.filter_vmap(project)(self.blocks)
        return CrossInputs(keys, values, mask)

    def init_cache(self, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty self-attention cache for every layer: `[layers, max_len, kv_heads, head_dim]`.

        It stores the key/value heads only (fewer than the query heads under grouped-query
        attention), so one cached token takes
        `2 * layers * kv_heads * head_dim * dtype.itemsize` bytes (keys and values).
        """
        attention = self.blocks.self_attention
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
        """Run every layer. Extras (cache, attention weights) come back stacked on `layers`.

        `inputs` (`BlockInputs`) are the same for every layer, except that `cross` and `cache`
        hold every layer's, stacked on `layers`. With rotary attention the cos/sin table of the
        positions is made here, once, outside the layer loop, and handed to every layer.
        """
        inputs = BlockInputs() if inputs is None else inputs
        local = self._local_rotary(inputs, x.shape[0])
        inputs = inputs.with_rotary(self.blocks.self_attention, x.shape[0])
        params, static = eqx.partition(self.blocks, eqx.is_array)
        layer_keys = None if key is None else jax.random.split(key, self.num_layers)
        cross = inputs.cross
        shared = inputs._replace(cross=None, cache=None)  # the per-layer parts go in per_layer
        cross_mask = None if cross is None else cross.mask
        kinds = self._kinds(shared, local)
        scan = scans(self.scan)

        def body(h, per_layer, is_global: bool | None = None, is_first: bool = False):
            """One layer; its kind is `is_global` (known while tracing) or, scanned, the flag
            after its other inputs (and whether it is the first layer, after that)."""
            block_params, layer_key, layer_cache, layer_cross = per_layer[:4]
            skip = is_first if len(per_layer) < 6 or per_layer[5] is None else per_layer[5]
            block = eqx.combine(block_params, static)
            if layer_cross is not None:
                cross_keys, cross_values = layer_cross
                layer_cross = CrossInputs(cross_keys, cross_values, cross_mask)

            def run(kind_inputs: BlockInputs):
                layer_inputs = kind_inputs._replace(
                    cross=layer_cross, cache=layer_cache, skip_attention_norm=skip
                )
                return block(h, layer_inputs, key=layer_key, return_weights=return_weights)

            if kinds is None:
                return run(shared)
            if is_global is not None:
                return run(kinds[1] if is_global else kinds[0])
            return jax.lax.cond(per_layer[4], lambda: run(kinds[1]), lambda: run(kinds[0]))

        stacked_cross = None if cross is None else (cross.keys, cross.values)
        flags = self._flags(scan)
        if inputs.cache is not None:
            if not self.first_attention_norm:
                raise ValueError("first_attention_norm=False is for encoders, not a KV cache")
            run = self._scan_with_cache if scan else self._unroll_with_cache
            return run(body, x, (params, layer_keys, stacked_cross), inputs.cache, flags)

        def remat(function):
            if self.remat is None:
                return function
            return jax.checkpoint(function, policy=REMAT_POLICIES[self.remat])

        skip_first = not self.first_attention_norm
        if scan:
            firsts = jnp.arange(self.num_layers) == 0 if skip_first else None
            xs = (params, layer_keys, None, stacked_cross, flags, firsts)
            return jax.lax.scan(remat(body), x, xs)
        extras = []
        for index in range(self.num_layers):
            layer = _layer_slice((params, layer_keys, None, stacked_cross), index)
            first = skip_first and index == 0
            layer_body = functools.partial(body, is_global=_flag(flags, index), is_first=first)
            x, extra = remat(layer_body)(x, layer)
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
        attention = self.blocks.self_attention
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

    def _scan_with_cache(self, body, x, per_layer, cache: KVCache, flags=None):
        """The scan for incremental decoding: the cache rides in the carry, not in `xs`/`ys`.

        As a scanned input and output the whole cache would be rewritten at every decoding step
        (and, under vmap, transposed); in the carry each layer updates its slice in place.
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

        start = (x, cache.keys, cache.values, jnp.zeros((), jnp.int32))
        (x, keys, values, _), extras = jax.lax.scan(cached_body, start, (per_layer, flags))
        return x, extras._replace(cache=KVCache(keys, values, cache.index))

    def _unroll_with_cache(self, body, x, per_layer, cache: KVCache, flags=None):
        """Incremental decoding, unrolled: each layer writes its slice of the stacked cache in
        place, as the scan's carry does, rather than the slices being stacked anew."""
        keys, values = cache.keys, cache.values
        extras = []
        for index in range(self.num_layers):
            block_params, layer_key, layer_cross = _layer_slice(per_layer, index)
            layer_cache = KVCache(keys[index], values[index], cache.index)
            flag = _flag(flags, index)
            x, extra = body(x, (block_params, layer_key, layer_cache, layer_cross), flag)
            assert extra.cache is not None
            keys = keys.at[index].set(extra.cache.keys)
            values = values.at[index].set(extra.cache.values)
            extras.append(extra._replace(cache=None))
        return x, _stacked(extras)._replace(cache=KVCache(keys, values, cache.index))


def _flag(flags: Array | tuple[bool, ...] | None, index: int) -> bool | None:
    """Layer `index`'s kind in an unrolled stack (the flags are a tuple there)."""
    return None if flags is None else bool(flags[index])


def _layer_slice(per_layer, index: int):
    """Layer `index` of arrays stacked on a leading `layers` axis (None stays None)."""
    return jax.tree_util.tree_map(lambda a: a[index], per_layer)


def _stacked(extras: list[BlockExtras]) -> BlockExtras:
    """Per-layer extras stacked on a leading `layers` axis, as `lax.scan` returns them."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *extras)
