"""Cross-entropy over a vocabulary, from a model's features, a chunk of positions at a time.

The float32 log-softmax of a whole batch is the largest tensor of a language-model step: GPT-2
at 16 x 1024 tokens holds 16,384 x 50,304 float32 logits, 3.3 GB, read and written several
times forward and backward. `vocab_statistics` never makes it. It takes the features (the input
of the output layer) and the output layer (`zoo.nn.VocabHead`), splits the positions into
chunks, and for each chunk computes the logits, their float32 log-sum-exp and the summed
statistics; only the chunk's logits in the compute dtype (bf16 in mixed precision) are kept for
the backward pass, and its float32 work is redone there chunk by chunk. At most
`chunk_bytes` (1 GiB by default) of float32 logits exist at once: logits computed in float32
are not kept at all, but computed again chunk by chunk in the backward pass.

The vocabulary is padded for the matmul where that is faster (`zoo.nn.vocab_multiple`: to a
multiple of 128 on a GPU); padding columns are masked out of the softmax, the accuracy and the
label smoothing, so the numbers are those of the real vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int

from zoo.nn.vocab import VocabHead, vocab_multiple
from zoo.tasks.base import Stats, token_losses, weighted_stats

CHUNK_BYTES = 1 << 30  # float32 logits alive at once in `vocab_statistics`
_SAVED = "vocab_logits"  # the one value of a chunk the backward pass keeps


def loss_chunks(num_positions: int, width: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many chunks keep each one's float32 `[positions, width]` logits within
    `chunk_bytes`: a power of two, so that power-of-two batches split evenly."""
    needed = math.ceil(num_positions * width * 4 / chunk_bytes)
    return min(1 << max(needed - 1, 0).bit_length(), num_positions)


def vocab_statistics(
    head: VocabHead,
    features: Float[Array, "*positions d_model"],
    targets: Int[Array, "*positions"],
    weight: Bool[Array, "*positions"],
    *,
    label_smoothing: float = 0.0,
    multiple: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Stats:
    """Summed cross-entropy statistics of `head(features)` against `targets` where `weight`.

    The same numbers as `token_losses` on the full logits (see the module docstring for how it
    avoids them). `multiple` pads the vocabulary of a table head for the matmul (None: the
    platform's default, `zoo.nn.vocab_multiple`).

    Args:
        head: the model's output head.
        features: the final hidden states, any leading position axes.
        targets: the token to predict at each position.
        weight: which positions count.
        label_smoothing: the probability mass spread over the whole vocabulary.
        multiple: pad a table head's vocabulary to this multiple (None: the platform's).
        chunk_bytes: the float32 logits held at once; the positions are chunked to fit.
    """
    multiple = vocab_multiple(multiple)
    d_model = features.shape[-1]
    num_positions = math.prod(features.shape[:-1])
    chunks = loss_chunks(num_positions, head.width(multiple), chunk_bytes)

    def chunk_statistics(head, features, targets, weight) -> Stats:
        logits = checkpoint_name(head(features, multiple=multiple), _SAVED)
        objective, nll, correct = token_losses(
            logits, targets, label_smoothing, vocab_size=head.vocab_size
        )
        return weighted_stats(objective, nll, correct, weight)

    if chunks == 1:  # the positions as they come: the sums run in the order they always did
        return chunk_statistics(head, features, targets, weight)
    features = features.reshape(-1, d_model)
    targets, weight = targets.reshape(-1), weight.reshape(-1)
    size = -(-num_positions // chunks)
    extra = size * chunks - num_positions  # padding positions, weight 0
    features = jnp.pad(features, ((0, extra), (0, 0))).reshape(chunks, size, d_model)
    targets = jnp.pad(targets, (0, extra)).reshape(chunks, size)
    weight = jnp.pad(weight, (0, extra)).reshape(chunks, size)
    # keep each chunk's logits (compute dtype) for the backward pass, redo the float32 rest;
    # logits computed in float32 are not kept (all chunks' would be the [positions, vocab]
    # float32 array the chunks avoid): the backward pass computes each chunk's again
    policy = jax.checkpoint_policies.save_only_these_names(_SAVED)
    if features.dtype == jnp.float32:
        policy = jax.checkpoint_policies.nothing_saveable
    one_chunk = jax.checkpoint(chunk_statistics, policy=policy)

    def add_chunk(total: Stats, chunk) -> tuple[Stats, None]:
        return total + one_chunk(head, *chunk), None

    total, _ = jax.lax.scan(add_chunk, Stats.zero(), (features, targets, weight))
    return total
