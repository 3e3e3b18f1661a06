"""Uncached references: full forwards that recompute the whole prefix at every step."""

import equinox as eqx
import jax.numpy as jnp

REFERENCE_WIDTH = 16  # full forwards run at this width; causality makes the tail irrelevant


@eqx.filter_jit
def _gpt_forward(model, tokens):
    return model(tokens, jnp.ones(tokens.shape, bool))


def gpt_logits(model, sequence):
    """Uncached logits of every position of `sequence` (a list), all positions real."""
    padded = list(sequence) + [0] * (REFERENCE_WIDTH - len(sequence))
    return _gpt_forward(model, jnp.asarray(padded, jnp.int32))[: len(sequence)]


@eqx.filter_jit
def _translator_forward(model, src, tgt):
    return model(src, tgt)


def translator_logits(model, src, target):
    """Uncached, teacher-forced logits for `target` (a list starting with bos)."""
    padded = list(target) + [0] * (REFERENCE_WIDTH - len(target))
    return _translator_forward(model, jnp.asarray(src), jnp.asarray(padded, jnp.int32))[
        : len(target)
    ]


def reference_greedy(next_logits, num_new, eos_id, fill_id):
    """Greedy decoding by recomputing the whole prefix each step: `next_logits(new_tokens)`."""
    new = []
    for _ in range(num_new):
        new.append(int(jnp.argmax(next_logits(new))))
        if eos_id is not None and new[-1] == eos_id:
            break
    return new + [fill_id] * (num_new - len(new))
