"""The vocabulary loss: chunked and padded, it gives the numbers and gradients of the plain one."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.translator import TranslatorHead
from zoo.nn import Linear, VocabHead, kernel_platform, vocab_multiple
from zoo.tasks.base import token_losses, weighted_stats
from zoo.tasks.vocab_loss import loss_chunks, vocab_statistics

VOCAB, D_MODEL = 11, 6


def problem(seed=0, positions=(3, 7)):
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(VOCAB, D_MODEL)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(VOCAB,)), jnp.float32)
    features = jnp.asarray(rng.normal(size=(*positions, D_MODEL)) * 2, jnp.float32)
    targets = jnp.asarray(rng.integers(0, VOCAB, positions), jnp.int32)
    weight = jnp.asarray(rng.random(positions) < 0.8)
    return table, bias, features, targets, weight


def plain(head, features, targets, weight, smoothing):
    """The textbook path: full logits, then `token_losses`."""
    logits = jax.vmap(head)(features)
    return weighted_stats(*token_losses(logits, targets, smoothing), weight)


def as_tuple(stats):
    return np.array([stats.loss_sum, stats.nll_sum, stats.weight, stats.correct])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("multiple, chunk_bytes", [(1, 1 << 30), (8, 1 << 30), (1, 100), (16, 300)])
def test_chunked_and_padded_equal_the_plain_loss_and_gradients(multiple, chunk_bytes, smoothing):
    table, bias, features, targets, weight = problem()

    def chunked(table, features):
        head = VocabHead(table, bias=bias, scale=0.5)
        stats = vocab_statistics(
            head,
            features,
            targets,
            weight,
            label_smoothing=smoothing,
            multiple=multiple,
            chunk_bytes=chunk_bytes,
        )
        return stats.loss, stats

    def reference(table, features):
        stats = plain(VocabHead(table, bias=bias, scale=0.5), features, targets, weight, smoothing)
        return stats.loss, stats

    (_, stats), grads = jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True)(table, features)
    (_, ref_stats), ref_grads = jax.value_and_grad(reference, argnums=(0, 1), has_aux=True)(
        table, features
    )
    np.testing.assert_allclose(as_tuple(stats), as_tuple(ref_stats), rtol=1e-6, atol=1e-6)
    assert float(stats.weight) == float(np.sum(weight))
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.shape == ref_grad.shape  # the real vocabulary: padding is internal
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_loss_chunks_keep_float32_logits_within_the_budget():
    assert loss_chunks(16 * 1024, 50304) == 4  # GPT-2 at 16 x 1024: 3.3 GB -> 4 x 824 MB
    assert loss_chunks(16 * 1024, 50304, chunk_bytes=1 << 28) == 16
    assert loss_chunks(128, 64) == 1
    assert loss_chunks(3, 1000, chunk_bytes=8) == 3  # never more chunks than positions
    for positions, width in [(7, 11), (1000, 50304), (16 * 1024, 151_936)]:
        chunks = loss_chunks(positions, width)
        assert chunks & (chunks - 1) == 0
        assert -(-positions // chunks) * width * 4 <= (1 << 30) or chunks == positions


def test_padding_columns_never_win_and_label_smoothing_spreads_over_the_real_vocabulary():
    """Logits below every padding column's zero: the top token is still a real one, and the
    smoothed objective averages over the 11 real columns, not the 16 padded ones."""
    table, _, features, targets, weight = problem(positions=(5,))
    head = VocabHead(-jnp.abs(table))
    features = jnp.abs(features)  # every real logit < 0 = a padding column's logit
    padded = vocab_statistics(head, features, targets, weight, label_smoothing=0.2, multiple=16)
    logits = np.asarray(features @ -jnp.abs(table).T, np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -logp[np.arange(5), np.asarray(targets)]
    objective = 0.8 * nll + 0.2 * -logp.mean(-1)
    w = np.asarray(weight, np.float64)
    assert float(padded.loss_sum) == pytest.approx(float((objective * w).sum()), rel=1e-5)
    correct = (logits.argmax(-1) == np.asarray(targets)) * w
    assert float(padded.correct) == correct.sum()


def test_vocab_head_pads_a_table_with_zero_columns_and_leaves_a_layer_alone():
    table, bias, features, _, _ = problem(positions=(4,))
    head = VocabHead(table, bias=bias)
    assert head.width(8) == 16 and head.width(1) == VOCAB
    padded = head(features, multiple=8)
    assert padded.shape == (4, 16)
    np.testing.assert_allclose(padded[:, :VOCAB], head(features), rtol=1e-6)
    assert np.all(np.asarray(padded[:, VOCAB:]) == 0)
    linear = Linear(D_MODEL, VOCAB, key=jax.random.key(0))
    from_linear = VocabHead(linear)  # a plain Linear is a table with a bias
    assert from_linear.weight is linear.weight and from_linear.projection is None
    lora = zoo.lora.LoRALinear.wrap(linear, rank=2, alpha=4.0, key=jax.random.key(1))
    other = VocabHead(lora)  # any other layer: called as it is, never padded
    assert other.projection is lora and other.width(128) == VOCAB
    np.testing.assert_allclose(other(features, multiple=128), lora(features), rtol=1e-6)


def test_the_vocabulary_multiple_follows_the_platform():
    assert vocab_multiple() == 1  # this CPU
    with kernel_platform("gpu"):
        assert vocab_multiple() == 128
        assert vocab_multiple(1) == 1
    with pytest.raises(ValueError, match="positive integer"):
        vocab_multiple(0)


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("gpt-tiny", {}),
        ("llama-tiny", {}),  # untied Linear head
        ("translator-tiny", {}),
        ("t5-small", dict(num_layers=1, d_model=32, d_ff=64, num_heads=2, vocab_size=40)),
    ],
)
def test_models_are_their_features_through_their_output_head(preset, overrides):
    model = zoo.create(preset, key=jax.random.key(0), **overrides)
    model = eqx.nn.inference_mode(model)
    tokens = jnp.arange(3, 11) % model.config.vocab_size
    if isinstance(model, zoo.Translator):
        logits = model(tokens, tokens)
        via_head = model.output_head(model.features(tokens, tokens))
    else:
        logits = model(tokens)
        via_head = model.output_head(model.features(tokens))
    np.testing.assert_array_equal(logits, via_head)


def test_marian_bias_and_t5_scale_are_part_of_the_translator_head():
    model = zoo.create(
        "translator-tiny", key=jax.random.key(0), head=TranslatorHead(bias=True, scale=True)
    )
    head = model.output_head
    assert head.bias is model.output_bias and head.scale == model.config.d_model**-0.5
