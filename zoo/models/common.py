"""Input checks and small pieces every flavor uses."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras
from zoo.nn.cache import KVCache
from zoo.nn.embedding import check_token_ids
from zoo.nn.mask import Compaction, Mask
from zoo.nn.moe import RouterStats
from zoo.nn.plan import LayerPlan
from zoo.nn.stack import LayerStack


class Routed(NamedTuple):
    """What a model computes and, for a mixture of experts, its routers' statistics summed over
    the layers and the real tokens (`zoo.nn.moe.RouterStats`; None for a dense model): what a
    task forms the router losses from (`zoo.tasks.router_losses`)."""

    output: Array
    router: RouterStats | None


def routed(output: Array, *extras: BlockExtras) -> Routed:
    """`output` with the router statistics of the stacks whose `extras` are given, pooled."""
    stats = [extra.router.total() for extra in extras if extra.router is not None]
    if not stats:
        return Routed(output, None)
    pooled = jax.tree_util.tree_map(lambda *parts: sum(parts[1:], parts[0]), *stats)
    return Routed(output, pooled)


def layer_stack(config: TransformerConfig, plan: LayerPlan, *, key: PRNGKeyArray) -> LayerStack:
    """The blocks of `plan` at the config's width and initialisation, run as the config says
    (scanned or unrolled, with its rematerialisation)."""
    return LayerStack(
        plan,
        config.d_model,
        init=config.init,
        scan=config.scan_layers,
        remat=config.remat,
        key=key,
    )


def check_tokens(
    tokens: Array, *, vocab_size: int, max_positions: int, name: str = "tokens"
) -> Int[Array, " seq"]:
    """Check rank, length and id range of one example's token ids (id range also under jit)."""
    if not hasattr(tokens, "ndim"):
        raise TypeError(
            f"{name} must be a JAX array of token ids, got a {type(tokens).__name__}; "
            f"wrap it: jnp.asarray({name}), or for text encode it with the model's tokenizer first"
        )
    if tokens.ndim != 1:
        raise ValueError(
            f"{name} must be Int[Array, 'seq'] (one example), got shape {tuple(tokens.shape)}; "
            "for a batch of examples use jax.vmap(model)(batch)"
        )
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one token")
    if tokens.shape[0] > max_positions:
        raise ValueError(
            f"{name} has {tokens.shape[0]} positions but the model takes at most "
            f"max_positions={max_positions}; truncate the input or build a model with a larger "
            "max_positions"
        )
    return check_token_ids(tokens, vocab_size, what=name)


def valid_positions(
    tokens: Int[Array, " seq"], pad_id: int | None, mask: Bool[Array, " seq"] | None
) -> Bool[Array, " seq"] | None:
    """True at real tokens: the explicit `mask` if given, else `tokens != pad_id`."""
    if mask is not None:
        if mask.shape != tokens.shape:
            raise ValueError(
                f"mask must have the tokens' shape {tuple(tokens.shape)}, got {tuple(mask.shape)}"
            )
        return mask.astype(bool)
    if pad_id is None:
        return None
    return tokens != pad_id


def token_positions(key_valid: Bool[Array, " seq"] | None, num_tokens: int) -> Int[Array, " seq"]:
    """Absolute position of every token, counting real tokens only.

    Without padding that is 0, 1, 2, ...; right padding leaves the real tokens' positions alone;
    left padding shifts them back to start at 0. Padding positions repeat a neighbour's.
    """
    if key_valid is None:
        return jnp.arange(num_tokens)
    return jnp.maximum(jnp.cumsum(key_valid.astype(jnp.int32)) - 1, 0)


def segment_positions(
    segments: Int[Array, " seq"], num_tokens: int
) -> tuple[Int[Array, " seq"], Int[Array, " seq"]]:
    """(document of every token, its position inside the document) for packed documents.

    A document is a run of equal `segments` ids: `[7, 7, 7, 2, 2, 7]` holds three documents
    (the last 7 is a new one), at positions `[0, 1, 2, 0, 1, 0]`.
    """
    if segments.shape != (num_tokens,):
        raise ValueError(
            f"segments must give one document id per token, shape ({num_tokens},), got "
            f"{tuple(segments.shape)}"
        )
    index = jnp.arange(num_tokens)
    starts = jnp.concatenate([jnp.ones((1,), bool), segments[1:] != segments[:-1]])
    first = jax.lax.cummax(jnp.where(starts, index, 0))
    return jnp.cumsum(starts.astype(jnp.int32)), index - first


def check_cache_room(cache: KVCache, new: int, max_positions: int) -> KVCache:
    """`cache`, or an error (under jit too) if `new` more positions do not fit it or the model."""
    limit = min(cache.capacity, max_positions)
    index = eqx.error_if(
        cache.index,
        cache.index + new > limit,
        f"decoding past the end: the cache holds {cache.capacity} positions and the model takes "
        f"{max_positions}; shorten the prompt or generate fewer tokens",
    )
    return KVCache(cache.keys, cache.values, index)


def compact_padding(
    valid: Bool[Array, " seq"] | None,
    mask: Mask,
    tokens: Int[Array, " seq"],
    positions: Int[Array, " seq"],
    per_token: Int[Array, " seq"] | None = None,
) -> tuple[
    Compaction | None, Mask, Int[Array, " seq"], Int[Array, " seq"], Int[Array, " seq"] | None
]:
    """One example's real tokens first, in order, so that the layers see its padding as a length.

    `valid` (`[seq]`, True at real tokens) gives the order (`zoo.nn.Compaction`): `tokens`,
    their `positions` and `per_token` (`[seq]` each; `per_token` is token types or document
    ids, None stays None) are gathered into it, and `mask` sees only the first
    `compaction.length` keys. Without `valid` (no padding) nothing moves.

    Returns `(compaction or None, mask, tokens, positions, per_token)`; `restore_order` puts
    the layers' outputs back with the compaction.
    """
    if valid is None:
        return None, mask, tokens, positions, per_token
    compaction = Compaction.of(valid)
    tokens, positions = compaction.gather(tokens), compaction.gather(positions)
    per_token = None if per_token is None else compaction.gather(per_token)
    return compaction, mask.limit_keys(compaction.length), tokens, positions, per_token


def restore_order(
    compaction: Compaction | None, x: Float[Array, "seq d_model"], extras: BlockExtras
) -> tuple[Float[Array, "seq d_model"], BlockExtras]:
    """The layers' output `[seq, d_model]` and self-attention weights of a pass compacted by
    `compact_padding`, back in the tokens' own order (unchanged without a compaction)."""
    if compaction is None:
        return x, extras
    weights = uncompact_weights(extras.self_weights, compaction)
    return compaction.scatter(x), extras._replace(self_weights=weights)


def uncompact_weights(
    weights: Float[Array, "*layers heads seq kv_seq"] | None, compaction: Compaction | None
) -> Float[Array, "*layers heads seq kv_seq"] | None:
    """Attention weights of a compacted self-attention, back in the tokens' own order."""
    if weights is None or compaction is None:
        return weights
    return compaction.scatter(compaction.scatter(weights, axis=-1), axis=-2)
