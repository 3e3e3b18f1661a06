"""Shared pieces of the LoRA tests: tiny models of each flavor, random adapters, inputs."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

import zoo
from zoo.nn.lora import is_lora
from zoo.tree import path_name

TOKENS = jnp.array([[1, 5, 9, 4, 7, 3], [1, 7, 7, 3, 8, 2]], jnp.int32)


def randomize_adapters(model, *, seed: int = 1, std: float = 0.2):
    """`model` with every `lora_b` random (fresh adapters have B = 0 and change nothing)."""
    layers = zoo.lora.lora_layers(model)
    key = jax.random.key(seed)

    def fill(path, node):
        if not isinstance(node, zoo.lora.LoRALinear):
            return node
        noise = std * jax.random.normal(
            jax.random.fold_in(key, hash(path) % 2**31), node.lora_b.shape
        )
        return zoo.lora.LoRALinear(
            node.base,
            node.lora_a,
            noise.astype(node.lora_b.dtype),
            alpha=node.alpha,
            dropout=node.dropout,
        )

    assert layers
    return jax.tree_util.tree_map_with_path(
        lambda p, n: fill(path_name(p), n), model, is_leaf=is_lora
    )


@eqx.filter_jit
def forward(model, tokens=TOKENS):
    """Batched logits of any flavor (the translator reads `tokens` as source and target)."""
    if isinstance(model, zoo.Translator):
        return jax.vmap(model)(tokens, tokens)
    return jax.vmap(model)(tokens)
