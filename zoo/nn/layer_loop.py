"""How a stack loops over its layers: scanned or unrolled, and what the backward recomputes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array

from zoo.nn.block import BlockExtras, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.kernel import current_platform

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
LAYER_LOOPS = ("auto", "scan", "unroll")  # a config's `layer_loop`: `scan` None, True, False


def remat_policy(remat: str | None) -> str | None:
    """The policy (`REMAT_POLICIES` key, or None) a stack built with `remat` uses when traced
    now: "auto" chooses by the platform, as `scans` does."""
    if remat == "auto":
        return "dots" if current_platform() == "cpu" else None
    return remat


def scans(scan: bool | None) -> bool:
    """Whether a stack built with `scan` runs its layers with `lax.scan` when traced now: an
    explicit choice, else unrolled on a GPU and scanned elsewhere (`zoo.nn.stack`)."""
    return current_platform() != "gpu" if scan is None else scan


# what each layer of a run gets of its own, stacked on a leading axis (or one layer's row of
# them): its weights, dropout key, cross-attention keys and values
LayerArrays = tuple[TransformerBlock, Array | None, tuple[Array, Array] | None]


Carry = tuple[Array, KVCache | None]  # the hidden states and the stacked cache (decoding)
Step = Callable[..., tuple[Carry, BlockExtras]]  # `step(carry, arrays, *, layer, call)`


def loop_layers(
    step: Step,
    carry: Carry,
    arrays: LayerArrays,
    first: int,
    calls: Sequence[int],
    *,
    scan: bool,
    policy: str | None,
) -> tuple[Carry, BlockExtras]:
    """`step` over the layers `first, first + 1, ...` of a run, each with its call: one
    `lax.scan`, or unrolled (layer numbers and calls then known while tracing).

    Args:
        step: one layer, `step(carry, arrays, *, layer, call) -> (carry, extras)`.
        carry: the hidden states and the stacked KV cache (None without one).
        arrays: the run's weights, dropout keys and cross keys/values, stacked by layer.
        first: the run's first layer number (its row of the stacked cache).
        calls: each layer's call, an index the step reads.
        scan: True scans the layers, False unrolls them.
        policy: what the backward recomputes of each layer (`REMAT_POLICIES` key), or None.

    Returns the final carry and the layers' extras stacked on a leading `layers` axis.
    """

    def remat(function):
        return (
            function if policy is None else jax.checkpoint(function, policy=REMAT_POLICIES[policy])
        )

    if scan:

        def body(carry, xs):
            layer_arrays, layer, call = xs
            return step(carry, layer_arrays, layer=layer, call=call)

        layers = jnp.arange(first, first + len(calls))
        return jax.lax.scan(remat(body), carry, (arrays, layers, jnp.asarray(calls)))
    extras = []
    for index, call in enumerate(calls):
        layer_arrays = jax.tree_util.tree_map(lambda a, i=index: a[i], arrays)
        one = functools.partial(step, layer=first + index, call=call)
        carry, extra = remat(one)(carry, layer_arrays)
        extras.append(extra)
    return carry, jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *extras)
