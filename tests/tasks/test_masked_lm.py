"""Masked-LM pretraining: masking statistics on a large sample, the loss by hand, refusals."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.tasks import MaskedLanguageModeling, mask_tokens

VOCAB, PAD, CLS, SEP, MASK_ID = 1000, 0, 1, 2, 3


def sample(rows: int = 512, length: int = 128, seed: int = 0) -> np.ndarray:
    """[CLS] words [SEP] padding, of random lengths: 65,536 positions."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(10, VOCAB, (rows, length))
    lengths = rng.integers(8, length, rows)
    tokens[np.arange(length)[None] >= lengths[:, None]] = PAD
    tokens[:, 0] = CLS
    tokens[np.arange(rows), lengths - 1] = SEP
    return tokens.astype(np.int32)


def specials() -> jax.Array:
    return jnp.zeros(VOCAB, bool).at[jnp.array([PAD, CLS, SEP, MASK_ID])].set(True)


def test_masking_rate_and_80_10_10_on_a_large_sample():
    tokens = sample()
    inputs, chosen = mask_tokens(
        jnp.asarray(tokens),
        jax.random.key(1),
        rate=0.15,
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        special=specials(),
    )
    inputs, chosen = np.asarray(inputs), np.asarray(chosen)
    maskable = tokens >= 10
    assert not chosen[~maskable].any()  # never [CLS], [SEP] or padding
    assert (inputs[~chosen] == tokens[~chosen]).all()  # only chosen positions change
    assert abs(chosen.sum() / maskable.sum() - 0.15) < 0.006  # ~37k maskable: 4 sigma
    picked, original = inputs[chosen], tokens[chosen]
    masked = (picked == MASK_ID).mean()
    kept = (picked == original).mean()
    random = ((picked != MASK_ID) & (picked != original)).mean()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(random - 0.1) < 0.015


def test_whole_word_masking_chooses_every_piece_of_a_word():
    tokens = sample(seed=2)
    continuation = jnp.zeros(VOCAB, bool).at[500:].set(True)  # ids >= 500 continue a word
    _, chosen = mask_tokens(
        jnp.asarray(tokens),
        jax.random.key(3),
        rate=0.15,
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        special=specials(),
        continues_word=continuation,
    )
    chosen = np.asarray(chosen)
    maskable = tokens >= 10
    starts = maskable & (tokens < 500)
    assert not chosen[~maskable].any()
    # a continuing piece is chosen exactly when the piece before it is (inside a word)
    inside = maskable[:, 1:] & (tokens[:, 1:] >= 500) & maskable[:, :-1]
    assert (chosen[:, 1:][inside] == chosen[:, :-1][inside]).all()
    assert abs(chosen[starts].mean() - 0.15) < 0.01  # the rate is per word


def test_mlm_loss_by_hand(key):
    """Logits = the head's bias ln(1, 1, 2, 4): p = 1/8, 1/8, 2/8, 4/8 at every position."""
    model = zoo.create("classifier-tiny", vocab_size=4, masked_lm=True, mask_id=3, key=key)
    head = model.mlm_head
    zeroed = eqx.tree_at(
        lambda h: (h.transform.weight, h.transform.bias, h.norm.bias, h.bias),
        head,
        (
            jnp.zeros_like(head.transform.weight),
            jnp.zeros_like(head.transform.bias),
            jnp.zeros_like(head.norm.bias),
            jnp.log(jnp.array([1.0, 1.0, 2.0, 4.0])),
        ),
    )
    model = eqx.tree_at(lambda m: m.mlm_head, model, zeroed)
    task = MaskedLanguageModeling(rate=1.0)  # every non-pad token is chosen
    batch = {"tokens": np.array([[1, 2, 3, 0]], np.int32)}
    loss, metrics = task(model, batch)
    # targets 1, 2, 3 (pad skipped): -ln(1/8) - ln(2/8) - ln(4/8) = (3 + 2 + 1) ln 2, over 3
    assert math.isclose(float(loss), 2 * math.log(2), rel_tol=1e-5)
    assert math.isclose(float(metrics["accuracy"]), 1 / 3, rel_tol=1e-6)  # argmax is 3


def test_evaluation_masks_the_same_positions_and_training_others(key):
    model = zoo.create("classifier-tiny", masked_lm=True, mask_id=3, key=key)
    task = MaskedLanguageModeling(special_ids=(1, 2))
    batch = {"tokens": sample(8, 32)[:, :32] % 64}
    assert float(task(model, batch)[0]) == float(task(model, batch)[0])
    assert float(task(model, batch, key=key)[0]) != float(task(model, batch)[0])


def test_refusals_say_what_to_do(key):
    plain = zoo.create("classifier-tiny", key=key)
    with pytest.raises(TypeError, match="masked_lm=True"):
        MaskedLanguageModeling(mask_id=3).check_model(plain)
    with_head = zoo.create("classifier-tiny", masked_lm=True, key=key)
    with pytest.raises(ValueError, match="needs a mask token: pass mask_id="):
        MaskedLanguageModeling().check_model(with_head)
    with pytest.raises(ValueError, match="BERT uses 0.15"):
        MaskedLanguageModeling(rate=0.0)
    with pytest.raises(ValueError, match="has no masked-LM head"):
        plain.masked_lm_logits(jnp.array([1, 2]))


def test_whole_word_needs_word_pieces():
    from zoo.data import WordTokenizer

    tokenizer = WordTokenizer.from_corpus(["a film", "the film"])
    with pytest.raises(ValueError, match="needs a WordPiece tokenizer"):
        MaskedLanguageModeling.for_tokenizer(tokenizer, whole_word=True)
    task = MaskedLanguageModeling.for_tokenizer(tokenizer)
    assert task.special_ids == (0, 1, 2, 3) and task.mask_id is None
