"""Turning user token batches (arrays or lists of lists) into right-padded arrays + lengths.

These checks run on the host, once per call, before anything is compiled: they are where a bad
batch gets a clear message instead of a wrong answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from jaxtyping import Array, Int

TokenBatch = Int[Array, "batch seq"] | np.ndarray | Sequence[Sequence[int]]


def pad_batch(
    token_batch: TokenBatch, pad_id: int | None, *, what: str = "prompts", ragged: bool = False
) -> np.ndarray:
    """A `[batch, seq]` int32 array; a list of token lists is right-padded with `pad_id`.

    With `ragged=True` (the caller knows each row's length) a model without `pad_id` pads with 0.
    """
    if isinstance(token_batch, str) or (
        isinstance(token_batch, list | tuple) and any(isinstance(row, str) for row in token_batch)
    ):
        raise TypeError(
            f"{what} are text, but this function takes token ids; for text use "
            "zoo.decoding.text (generate_texts, translate_texts, classify_texts) with the "
            "model's tokenizer, or the `zoo generate` / `zoo translate` commands"
        )
    if isinstance(token_batch, list | tuple):
        rows = [np.asarray(row, dtype=np.int64).reshape(-1) for row in token_batch]
        if not rows:
            raise ValueError(f"{what} is an empty batch; pass at least one sequence")
        widths = [row.shape[0] for row in rows]
        width = max(widths)
        if pad_id is None and min(widths) != width and not ragged:
            raise ValueError(
                f"{what} have different lengths ({min(widths)} to {width} tokens) and the model "
                "has no pad_id to pad them with; set pad_id in the config (e.g. "
                "zoo.create(..., pad_id=0)) or pass sequences of equal length"
            )
        batch = np.full((len(rows), width), 0 if pad_id is None else pad_id, np.int64)
        for index, row in enumerate(rows):
            batch[index, : row.shape[0]] = row
    else:
        batch = np.asarray(token_batch)
    if batch.ndim != 2:
        raise ValueError(
            f"{what} must be a [batch, seq] array or a list of token lists, got shape "
            f"{batch.shape}; for a single sequence use array[None]"
        )
    if batch.shape[0] == 0:
        raise ValueError(f"{what} is an empty batch; pass at least one sequence")
    if batch.shape[1] == 0:
        raise ValueError(f"{what} are empty (0 tokens); pass at least one token each")
    if not np.issubdtype(batch.dtype, np.integer):
        raise TypeError(f"{what} must hold integer token ids, got dtype {batch.dtype}")
    return batch.astype(np.int32)


def compact_left(
    batch: np.ndarray,
    attention_mask: TokenBatch,
    *,
    what: str = "prompts",
) -> tuple[np.ndarray, np.ndarray]:
    """Move each row's real tokens (`attention_mask` 1) to the front, in order.

    Accepts left- or right-padded batches as HuggingFace tokenizers return them; returns the
    right-padded batch and each row's length.
    """
    mask = np.asarray(attention_mask)
    if mask.shape != batch.shape:
        raise ValueError(
            f"attention_mask has shape {mask.shape} but {what} have {batch.shape}; pass the mask "
            "the tokenizer returned with these ids"
        )
    real = mask.astype(bool)
    lengths = real.sum(axis=1)
    out = np.zeros_like(batch)
    for row in range(batch.shape[0]):
        out[row, : lengths[row]] = batch[row][real[row]]
    return out, lengths.astype(np.int32)


def sequence_lengths(
    batch: np.ndarray,
    pad_id: int | None,
    lengths: Int[Array, " batch"] | np.ndarray | Sequence[int] | None = None,
    *,
    what: str = "prompts",
) -> np.ndarray:
    """Real tokens per row: `lengths` if given, else the row minus its trailing `pad_id`s.

    Pass `lengths` when a sequence really ends with the pad token (it would be cut otherwise).
    """
    num_rows, width = batch.shape
    if lengths is not None:
        found = np.asarray(lengths).astype(np.int64).reshape(-1)
        if found.shape[0] != num_rows:
            raise ValueError(f"lengths has {found.shape[0]} entries for {num_rows} {what}")
        if np.any(found > width):
            raise ValueError(f"lengths exceed the width of {what} ({width} tokens)")
    elif pad_id is None:
        found = np.full((num_rows,), width, np.int64)
    else:
        real = batch != pad_id
        # index of the last real token + 1; 0 for a row of padding only
        found = np.where(real.any(axis=1), width - np.argmax(real[:, ::-1], axis=1), 0)
    empty = np.flatnonzero(found < 1)
    if empty.size:
        raise ValueError(
            f"{what} {empty.tolist()} are empty (only padding); every sequence needs at least "
            "one real token"
        )
    return found.astype(np.int32)


# a batch of prompts, or a tokenizer's encoding of one: {"input_ids": ..., "attention_mask": ...}
PromptBatch = TokenBatch | Mapping[str, TokenBatch]


def encoding_parts(prompts: PromptBatch) -> tuple[TokenBatch, TokenBatch | None]:
    """`(ids, attention_mask or None)` of `prompts`: a mapping (what a HuggingFace tokenizer
    returns) gives its `input_ids` and `attention_mask`; a batch gives itself and None."""
    if not isinstance(prompts, Mapping):
        return prompts, None
    if "input_ids" not in prompts:
        raise ValueError(
            f"prompts given as a mapping need 'input_ids' (and 'attention_mask' when padded on "
            f"the left), as a tokenizer returns them; got the keys {sorted(prompts)}"
        )
    return prompts["input_ids"], prompts.get("attention_mask")
