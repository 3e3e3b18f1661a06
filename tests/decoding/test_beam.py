"""Beam search: a hand-built model where greedy is wrong, beam 1 == greedy, GPT beams.

(Beam 1 == greedy on a real model is checked in test_translate.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_reference import gpt_logits

from zoo.decoding.beam import beam_search, length_penalty
from zoo.decoding.generate import beam_generate
from zoo.decoding.loop import Stopping, sample_loop

PAD, BOS, EOS, A, B, C, D = range(7)
VOCAB, MAX_LEN = 7, 4
STOPPING = Stopping(MAX_LEN, eos_id=EOS, fill_id=PAD)


def code(prefix):
    """A number for every prefix: the stub's state, so its scores depend on the whole prefix."""
    value = 0
    for token in prefix:
        value = value * VOCAB + token
    return value


def prefix_table():
    """Next-token probabilities by prefix. Greedy takes A (0.55) and ends with A C EOS (0.198);
    B EOS (0.45 * 0.9 = 0.405) is the best sentence, and a beam of 2 finds it."""
    table = np.full((VOCAB ** (MAX_LEN + 1), VOCAB), 1e-3)
    table[:, [A, B, C, D, EOS]] = 0.2  # every prefix not listed below
    table[code([BOS])] = [1e-3, 1e-3, 1e-3, 0.55, 0.45, 1e-3, 1e-3]
    table[code([BOS, A])] = [1e-3, 1e-3, 0.35, 1e-3, 1e-3, 0.4, 0.25]
    table[code([BOS, B])] = [1e-3, 1e-3, 0.9, 0.05, 0.05, 1e-3, 1e-3]
    table[code([BOS, A, C])] = [1e-3, 1e-3, 0.9, 0.05, 0.05, 1e-3, 1e-3]
    table = table / table.sum(axis=1, keepdims=True)
    return jnp.log(jnp.asarray(table, jnp.float32))


TABLE = prefix_table()


def stub_step(tokens, codes):
    """Any batch shape: feed `tokens`, return log-probabilities of the next token."""
    codes = codes * VOCAB + tokens
    return TABLE[codes], codes


@jax.jit
def stub_greedy():
    return sample_loop(
        stub_step,
        jnp.zeros((1,), jnp.int32),
        jnp.full((1,), BOS, jnp.int32),
        stopping=STOPPING,
    )[0]


def stub_beam(beam_size, alpha):
    state = jnp.zeros((1,), jnp.int32)
    search = jax.jit(
        beam_search, static_argnums=0, static_argnames=("stopping", "beam_size", "alpha")
    )
    tokens, scores, _ = search(
        stub_step, state, jnp.full((1,), BOS, jnp.int32), beam_size=beam_size, alpha=alpha,
        stopping=STOPPING,
    )  # fmt: skip
    return tokens[0].tolist(), float(scores[0])


def test_greedy_misses_the_best_sentence_and_a_beam_of_two_finds_it():
    assert stub_greedy()[0].tolist() == [A, C, EOS, PAD]
    table = np.asarray(TABLE)
    for alpha in (0.0, 0.6):
        tokens, score = stub_beam(2, alpha)
        assert tokens == [B, EOS, PAD, PAD]
        log_prob = table[code([BOS]), B] + table[code([BOS, B]), EOS]
        np.testing.assert_allclose(score, log_prob / float(length_penalty(2, alpha)), rtol=1e-6)


def test_beam_of_one_is_greedy_on_the_stub():
    tokens, score = stub_beam(1, 0.6)
    assert tokens == stub_greedy()[0].tolist()
    table = np.asarray(TABLE)
    log_prob = table[code([BOS]), A] + table[code([BOS, A]), C] + table[code([BOS, A, C]), EOS]
    np.testing.assert_allclose(score, log_prob / float(length_penalty(3, 0.6)), rtol=1e-6)


def test_the_loops_take_their_stopping_as_one_record():
    state, first = jnp.zeros((1,), jnp.int32), jnp.full((1,), BOS, jnp.int32)
    loose = dict(max_len=MAX_LEN, eos_id=EOS, fill_id=PAD)  # spelled out before `Stopping`
    for name, value in loose.items():
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            sample_loop(stub_step, state, first, stopping=STOPPING, **{name: value})
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            beam_search(stub_step, state, first, stopping=STOPPING, beam_size=2, alpha=0.6,
                        **{name: value})  # fmt: skip
    with pytest.raises(TypeError, match="stopping"):
        sample_loop(stub_step, state, first)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        Stopping(0)


def test_length_penalty_is_gnmt():
    np.testing.assert_allclose(length_penalty(3, 0.6), (8 / 6) ** 0.6, rtol=1e-6)
    assert float(length_penalty(10, 0.0)) == 1.0


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]


def test_gpt_beam_scores_match_the_full_forward(gpt):
    tokens, scores = beam_generate(gpt, PROMPTS, max_new_tokens=4, beam_size=3)
    eos = gpt.config.eos_id
    for row, prompt in enumerate(PROMPTS):
        new = tokens[row].tolist()
        length = new.index(eos) + 1 if eos in new else len(new)
        log_probs = jax.nn.log_softmax(gpt_logits(gpt, prompt + new[:length]), axis=-1)
        total = sum(float(log_probs[len(prompt) - 1 + t, new[t]]) for t in range(length))
        expected = total / float(length_penalty(length, 0.6))
        np.testing.assert_allclose(float(scores[row]), expected, atol=1e-4)


@pytest.mark.parametrize("beam_size", [0, -1])
def test_bad_beam_sizes_raise(gpt, beam_size):
    with pytest.raises(ValueError, match="beam_size"):
        beam_generate(gpt, PROMPTS, max_new_tokens=2, beam_size=beam_size)
