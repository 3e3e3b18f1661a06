"""Translation: cached decoding equals full recomputation, greedy, beams, EOS, bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_reference import reference_greedy, translator_logits

import zoo
from zoo.decoding.beam import length_penalty
from zoo.decoding.translate import beam_translate, start_translation, translator_step

PAD, BOS = 0, 1  # translator-tiny: pad 0, bos 1, eos 2, 64 tokens, 64 positions
SOURCES = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
SRC = np.array([s + [PAD] * (4 - len(s)) for s in SOURCES], np.int32)
MAX_LEN = 6


def test_cached_logits_equal_full_recomputation_for_ragged_sources(translator):
    target = np.array([[BOS, 20, 21, 22], [BOS, 30, 31, 32], [BOS, 40, 41, 42]], np.int32)
    memory, caches = eqx.filter_jit(start_translation)(translator, jnp.asarray(SRC), 4)
    step = eqx.filter_jit(translator_step)
    cached = []
    for t in range(4):
        logits, caches = step(translator, memory, jnp.asarray(target[:, t]), caches)
        cached.append(logits)
    cached = np.stack(cached, axis=1)
    for row in range(3):
        expected = translator_logits(translator, SRC[row], target[row].tolist())
        np.testing.assert_allclose(cached[row], expected, atol=1e-5, rtol=0)


def test_greedy_translation_equals_argmax_of_the_full_forward(translator):
    out = zoo.translate(translator, jnp.asarray(SRC), max_len=MAX_LEN)
    assert out.shape == (3, MAX_LEN) and out.dtype == jnp.int32
    eos = translator.config.eos_id
    for row in range(3):
        expected = reference_greedy(
            lambda n, r=row: translator_logits(translator, SRC[r], [BOS, *n])[-1],
            MAX_LEN,
            eos,
            PAD,
        )
        assert out[row].tolist() == expected
    np.testing.assert_array_equal(zoo.translate(translator, SOURCES, max_len=MAX_LEN), out)


def test_beam_size_one_is_greedy(translator):
    greedy = zoo.translate(translator, SRC, max_len=MAX_LEN)
    beam, _ = beam_translate(translator, SRC, max_len=MAX_LEN, beam_size=1)
    np.testing.assert_array_equal(beam, greedy)


def rescore(model, src, tokens, eos, alpha):
    """Score of a hypothesis from the full forward: log-probability / length penalty."""
    tokens = tokens.tolist()
    length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
    logits = translator_logits(model, src, [BOS, *tokens[: length - 1]])
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    total = sum(float(log_probs[t, tokens[t]]) for t in range(length))
    return total / float(length_penalty(length, alpha)), length


def test_beam_hypotheses_end_at_eos_and_keep_their_true_scores(translator):
    # A model that ends sentences on a token the random weights like: same weights, new eos.
    greedy = np.asarray(zoo.translate(translator, SRC, max_len=MAX_LEN))
    eos = int(greedy[0, 1])
    model = zoo.create("translator-tiny", key=jax.random.key(2), eos_id=eos)
    tokens, scores = beam_translate(model, SRC, max_len=MAX_LEN, beam_size=3, length_penalty=0.6)
    lengths = []
    for row in range(3):
        expected, length = rescore(model, SRC[row], tokens[row], eos, 0.6)
        # A wrongly reordered cache would give scores the full forward does not reproduce.
        np.testing.assert_allclose(float(scores[row]), expected, atol=1e-4)
        assert (np.asarray(tokens[row, length:]) == PAD).all()
        lengths.append(length)
    assert min(lengths) < MAX_LEN, "at least one hypothesis should end with eos"


@pytest.mark.parametrize(
    ("src", "kwargs", "error", "message"),
    [
        (SRC, dict(max_len=0), ValueError, "max_len"),
        (SRC, dict(max_len=65), ValueError, "max_len"),
        (SRC, dict(max_len=4, beam_size=0), ValueError, "beam_size"),
        ([[5, 6], [PAD, PAD]], dict(max_len=4), ValueError, "empty"),
        (np.full((1, 65), 5, np.int32), dict(max_len=4), ValueError, "max_positions"),
        ("", dict(max_len=4), TypeError, "sources are text.*translate_texts"),
    ],
)
def test_bad_requests_raise_clear_errors(translator, src, kwargs, error, message):
    with pytest.raises(error, match=message):
        zoo.translate(translator, src, **kwargs)


def test_translate_refuses_other_models(gpt):
    with pytest.raises(TypeError, match="Translator"):
        zoo.translate(gpt, SRC, max_len=4)
