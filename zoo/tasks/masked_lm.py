"""Masked-LM pretraining (BERT): hide some tokens, predict them from both sides.

Each batch is masked afresh on the device: every token that is not special (padding, [CLS],
[SEP], unknown, ...) is chosen with probability `rate`; a chosen token is replaced by the mask
token 80% of the time, by a random token 10% of the time and left as it is 10% of the time, and
the model is scored on the chosen positions only. With whole-word masking (WordPiece tokenizers)
the pieces of a word (`play ##ing`) are chosen together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Int, PRNGKeyArray

from zoo.data.tokenizers.base import Tokenizer
from zoo.models.classifier import Classifier, ClassifierConfig
from zoo.tasks.base import Stats, Task, check_ids, example_keys, token_losses, weighted_stats
from zoo.tasks.router_losses import with_router_losses

MASK, RANDOM = 0.8, 0.1  # of the chosen tokens: replaced by the mask token, by a random token
EVAL_SEED = 0  # evaluation masks the same positions every time, so its losses compare
CONTINUATION = "##"  # how a WordPiece vocabulary marks the pieces that continue a word


def mask_tokens(
    tokens: Int[Array, "batch seq"],
    key: PRNGKeyArray,
    *,
    rate: float,
    mask_id: int,
    vocab_size: int,
    special: Bool[Array, " vocab"],
    continues_word: Bool[Array, " vocab"] | None = None,
) -> tuple[Int[Array, "batch seq"], Bool[Array, "batch seq"]]:
    """`(inputs, chosen)`: the masked model inputs and the positions to predict.

    `special[id]` marks ids never chosen (padding included); `continues_word[id]` marks the
    pieces that continue a word (whole-word masking: they follow the choice of its first piece).

    Args:
        tokens: a batch of token ids.
        key: the random key that picks the positions and their replacements.
        rate: the fraction of (non-special) positions chosen, 0.15 in BERT.
        mask_id: the `[MASK]` id; 80% of the chosen positions become it.
        vocab_size: random replacements (10% of the chosen) are drawn below it.
        special: ids never chosen, padding included.
        continues_word: ids that continue a word, for whole-word masking (None: off).
    """
    choose_key, how_key, random_key = jax.random.split(key, 3)
    maskable = ~special[tokens]
    draw = jax.random.uniform(choose_key, tokens.shape)
    if continues_word is not None:
        positions = jax.lax.broadcasted_iota(jnp.int32, tokens.shape, 1)
        starts = ~continues_word[tokens] | ~maskable
        first_piece = jax.lax.cummax(jnp.where(starts, positions, 0), axis=1)
        draw = jnp.take_along_axis(draw, first_piece, axis=1)
    chosen = (draw < rate) & maskable
    how = jax.random.uniform(how_key, tokens.shape)
    random_ids = jax.random.randint(random_key, tokens.shape, 0, vocab_size, dtype=tokens.dtype)
    inputs = jnp.where(chosen & (how < MASK), mask_id, tokens)
    inputs = jnp.where(chosen & (how >= MASK) & (how < MASK + RANDOM), random_ids, inputs)
    return inputs.astype(tokens.dtype), chosen


def word_continuations(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Ids of a WordPiece tokenizer's `##` pieces; a ValueError for other tokenizers."""
    inner = getattr(tokenizer, "tokenizer", None)  # tokenizers' or transformers' object
    get_vocab = getattr(inner, "get_vocab", None)
    vocab: dict[str, int] = get_vocab() if callable(get_vocab) else {}
    ids = tuple(sorted(int(i) for piece, i in vocab.items() if piece.startswith(CONTINUATION)))
    if not ids:
        raise ValueError(
            "whole-word masking needs a WordPiece tokenizer (word pieces marked '##', as BERT's "
            f"and DistilBERT's); this {type(tokenizer).__name__} has none: leave whole-word "
            "masking off (a word tokenizer's tokens are whole words already)"
        )
    return ids


class MaskedLanguageModeling(Task[Classifier]):
    """Pretrain a `zoo.Classifier` built with `masked_lm=True` on `tokens [batch, seq]`.

    `rate`: the share of non-special tokens chosen (BERT: 0.15). `mask_id`: the mask token
    (None: the model config's `mask_id`). `special_ids`: ids never chosen besides the model's
    `pad_id`. `continuation_ids`: the pieces that continue a word, for whole-word masking
    (`MaskedLanguageModeling.for_tokenizer(tok, whole_word=True)` finds them). Loss: mean
    cross-entropy over the chosen tokens (fp32). Metric: their accuracy. Evaluation (no key)
    masks with a fixed key, so the same positions every time.
    """

    flavor = "classifier"
    metric_name = "accuracy"
    required: ClassVar[dict[str, str]] = {"tokens": "[batch, seq]"}

    def __init__(
        self,
        rate: float = 0.15,
        *,
        mask_id: int | None = None,
        special_ids: Iterable[int] = (),
        continuation_ids: Iterable[int] | None = None,
    ):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"the masking rate must be in (0, 1], got {rate} (BERT uses 0.15)")
        self.rate = float(rate)
        self.mask_id = mask_id
        self.special_ids = tuple(sorted({int(i) for i in special_ids}))
        self.continuation_ids = None if continuation_ids is None else tuple(continuation_ids)

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: Tokenizer,
        rate: float = 0.15,
        *,
        whole_word: bool = False,
        mask_id: int | None = None,
    ) -> MaskedLanguageModeling:
        """The task for data encoded by `tokenizer`: its special ids are never chosen, its mask
        token (if it has one) is the mask id, its `##` pieces follow their word if `whole_word`."""
        specials = {*tokenizer.special_ids, *(i for i in [tokenizer.unk_id] if i is not None)}
        if mask_id is None:
            mask_id = getattr(tokenizer, "mask_id", None)
        continuations = word_continuations(tokenizer) if whole_word else None
        return cls(rate, mask_id=mask_id, special_ids=specials, continuation_ids=continuations)

    def _mask_id(self, model: Classifier) -> int:
        mask_id = self.mask_id if self.mask_id is not None else model.config.mask_id
        if mask_id is None:
            raise ValueError(
                "MaskedLanguageModeling needs a mask token: pass mask_id= (the tokenizer's "
                "[MASK] id) or build the model with mask_id set"
            )
        return mask_id

    def _tables(self, config: ClassifierConfig) -> tuple[Array, Array | None]:
        vocab = config.vocab_size
        specials = [i for i in (*self.special_ids, config.pad_id) if i is not None and i < vocab]
        special = jnp.zeros(vocab, bool).at[jnp.asarray(specials, jnp.int32)].set(True)
        if self.continuation_ids is None:
            return special, None
        pieces = jnp.asarray([i for i in self.continuation_ids if i < vocab], jnp.int32)
        return special, jnp.zeros(vocab, bool).at[pieces].set(True)

    def mask(
        self, model: Classifier, tokens: Int[Array, "batch seq"], key: PRNGKeyArray
    ) -> tuple[Int[Array, "batch seq"], Bool[Array, "batch seq"]]:
        """`(inputs, chosen)` for `tokens`, with this task's settings and `model`'s vocabulary."""
        config = model.config
        special, continues_word = self._tables(config)
        return mask_tokens(
            tokens,
            key,
            rate=self.rate,
            mask_id=self._mask_id(model),
            vocab_size=config.vocab_size,
            special=special,
            continues_word=continues_word,
        )

    def statistics(
        self, model: Classifier, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None = None
    ) -> Stats:
        tokens = jnp.asarray(batch["tokens"])
        mask_key, dropout_key = (
            (jax.random.key(EVAL_SEED), None) if key is None else jax.random.split(key)
        )
        inputs, chosen = self.mask(model, tokens, mask_key)

        def one(tokens, key):
            return model.masked_lm_logits_and_router(tokens, key=key)

        logits, router = jax.vmap(one)(inputs, example_keys(dropout_key, tokens.shape[0]))
        objective, nll, correct = token_losses(logits, tokens)
        stats = weighted_stats(objective, nll, correct, chosen)
        return with_router_losses(stats, router, model)

    def check_model(self, model: object) -> None:
        super().check_model(model)
        assert isinstance(model, Classifier)  # the check above
        if model.mlm_head is None:
            raise TypeError(
                "MaskedLanguageModeling trains the masked-LM head of a zoo.Classifier; this one "
                "has none: build it with masked_lm=True"
            )
        mask_id = self._mask_id(model)
        if not 0 <= mask_id < model.config.vocab_size:
            raise ValueError(
                f"mask_id={mask_id} is outside the model's vocabulary "
                f"[0, {model.config.vocab_size}); build the model with a vocabulary that holds it"
            )

    def _check_values(self, batch: Mapping[str, np.ndarray], model: Classifier) -> None:
        config = model.config
        check_ids("tokens", batch["tokens"], config.vocab_size, config.max_tokens)
