"""Input checks and small pieces every flavor uses."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras, BlockSettings, TransformerBlock
from zoo.nn.cache import KVCache
from zoo.nn.embedding import check_token_ids
from zoo.nn.mask import Compaction, Mask
from zoo.nn.stack import LayerStack


def layer_stack(
    config: TransformerConfig, num_layers: int, *, cross_attention: bool = False, key: PRNGKeyArray
) -> LayerStack:
    """`num_layers` blocks with the config's block settings, run as the config says (scanned
    or unrolled, with its rematerialisation). Layers whose settings differ (dense layers among
    experts, ModernBERT's layer 0 without an attention norm) go in one group per kind."""
    kinds: list[BlockSettings] = []
    layer_kinds = []
    for layer in range(num_layers):
        settings = config.block_settings(
            cross_attention=cross_attention, layer=layer, num_layers=num_layers
        )
        if settings not in kinds:
            kinds.append(settings)
        layer_kinds.append(kinds.index(settings))

    def maker(settings: BlockSettings):
        return lambda k: TransformerBlock(config.d_model, settings, init=config.init, key=k)

    return LayerStack(
        [maker(settings) for settings in kinds] if len(kinds) > 1 else maker(kinds[0]),
        num_layers,
        layer_kinds=layer_kinds,
        scan=config.scan_layers,
        remat=config.remat,
        pattern=config.layer_pattern(),
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
