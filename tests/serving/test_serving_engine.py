"""`zoo.serving.Engine`: a request's tokens alone equal its tokens beside others and `zoo.chat`'s
(greedy and sampled with its key), requests that outnumber the slots wait and join, a cancelled
request frees its slot, limits are refused with their numbers, and steady serving compiles
nothing new."""

from __future__ import annotations

import importlib.util
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.data import CharTokenizer
from zoo.data.chat.tokens import encode_prompt, end_of_turn_ids
from zoo.decoding import SamplingSettings
from zoo.decoding.chat import reply
from zoo.serving import Engine, EngineFull, PromptTooLong
from zoo.serving.slots import bucket_width

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
TOKENIZER = CharTokenizer(string.ascii_lowercase + " :\n")
MESSAGES = ["hello", "abc", "what is up with you today", "zz", "a much longer message here", "q"]


@pytest.fixture(scope="module")
def model():
    """A tiny GPT whose matrices are scaled up, so its greedy replies differ by prompt."""
    gpt = zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size)
    return jax.tree.map(lambda leaf: leaf * 3 if getattr(leaf, "ndim", 0) == 2 else leaf, gpt)


@pytest.fixture(scope="module")
def engine(model):
    with Engine(model, TOKENIZER, slots=4, max_len=64, max_waiting=8) as engine:
        yield engine


ENDS = end_of_turn_ids(TOKENIZER)


def prompt(text: str) -> np.ndarray:
    return encode_prompt([{"role": "user", "content": text}], TOKENIZER)


def tokens(generation) -> list[int]:
    return [event.token for event in generation]


def test_buckets_are_powers_of_two_within_the_slot():
    assert [bucket_width(n, 100) for n in (1, 16, 17, 33, 64, 65, 99)] == [
        16, 16, 32, 64, 64, 100, 100,
    ]  # fmt: skip


def test_greedy_alone_equals_beside_others_and_zoo_chat(model, engine):
    alone = [tokens(engine.submit(prompt(m), max_tokens=12, stop_ids=ENDS)) for m in MESSAGES]
    # six requests for four slots: two wait, then join as the first ones finish
    lengths = [12, 3, 9, 12, 5, 12]
    together = [
        engine.submit(prompt(m), max_tokens=n, stop_ids=ENDS)
        for m, n in zip(MESSAGES, lengths, strict=True)
    ]
    for message, generation, reference, length in zip(
        MESSAGES, together, alone, lengths, strict=True
    ):
        assert tokens(generation) == reference[:length]
        expected = reply(model, TOKENIZER, message, max_new_tokens=12)
        assert list(expected.tokens) == reference
    assert len({tuple(reference) for reference in alone}) > 2  # the replies differ
    assert engine.busy_slots() == 0


def test_a_sampled_request_draws_as_zoo_chat_with_its_key_beside_greedy_ones(model, engine):
    settings = SamplingSettings(1.5, top_k=12, top_p=0.95)
    key = jax.random.key(7)
    greedy = [engine.submit(prompt(m), max_tokens=10) for m in MESSAGES[:2]]
    sampled = engine.submit(prompt("hello"), max_tokens=10, sampling=settings, key=key)
    expected = reply(model, TOKENIZER, "hello", max_new_tokens=10, sampling=settings, key=key)
    drawn = tokens(sampled)
    stop = next((i for i, token in enumerate(drawn) if token in ENDS), len(drawn))
    assert drawn[:stop] == list(expected.tokens)
    for generation, message in zip(greedy, MESSAGES[:2], strict=True):
        assert tokens(generation) == tokens(engine.submit(prompt(message), max_tokens=10))


def test_logprobs_are_the_models_and_the_greedy_token_is_the_most_likely(model, engine):
    ids = prompt("abc")
    (first, *_) = list(engine.submit(ids, max_tokens=2, logprobs=3))
    logits = model(jnp.asarray(ids, jnp.int32))[-1]
    expected = np.asarray(jax.nn.log_softmax(logits))
    assert first.top[0][0] == first.token == int(np.argmax(expected))
    assert [i for i, _ in first.top] == np.argsort(-expected)[:3].tolist()
    np.testing.assert_allclose([v for _, v in first.top], np.sort(expected)[::-1][:3], atol=1e-4)


def test_a_full_queue_is_refused_and_a_cancelled_request_frees_its_slot(engine):
    # four slots run, eight requests wait (max_waiting=8): the thirteenth is refused
    running = [engine.submit(prompt("hello"), max_tokens=30) for _ in range(4)]
    for generation in running:
        next(iter(generation))  # all four hold their slots
    waiting = [engine.submit(prompt("abc"), max_tokens=2) for _ in range(8)]
    with pytest.raises(EngineFull, match="all 4 slots are busy and 8 requests wait"):
        engine.submit(prompt("zz"), max_tokens=3)
    for generation in running:
        generation.cancel()
    for generation in waiting:
        assert len(tokens(generation)) == 2 and generation.finish_reason == "length"
    for generation in running:
        tokens(generation)
        assert generation.finish_reason == "cancelled" and generation.generated < 30
    assert engine.busy_slots() == 0


def test_limits_are_refused_with_their_numbers(engine):
    with pytest.raises(PromptTooLong, match="the prompt has 60 tokens and 10 more were asked for"):
        engine.submit([1] * 60, max_tokens=10)
    with pytest.raises(ValueError, match=f"outside the vocabulary of {TOKENIZER.vocab_size}"):
        engine.submit([1, 99], max_tokens=1)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.submit([], max_tokens=1)
    assert len(tokens(engine.submit([1] * 60))) <= 4  # no max_tokens: the room left


def test_steady_serving_compiles_nothing_new(engine):
    warm = [engine.submit(prompt(m), max_tokens=4) for m in MESSAGES[:3]]
    for generation in warm:
        tokens(generation)
    compiled = len(engine.programs.compiles)
    settings = [SamplingSettings(), SamplingSettings(0.7), SamplingSettings(1.3)]
    again = [
        engine.submit(prompt(m), max_tokens=4, sampling=s, key=jax.random.key(i))
        for i, (m, s) in enumerate(zip(["hi", "abcd", "what"], settings, strict=True))
    ]
    first_compiles = len(engine.programs.compiles) - compiled
    for generation in again:
        tokens(generation)
    repeat = [
        engine.submit(prompt(m), max_tokens=4, sampling=s, key=jax.random.key(i + 9))
        for i, (m, s) in enumerate(zip(["ho", "xyz", "who"], settings, strict=True))
    ]
    for generation in repeat:
        tokens(generation)
    # the sampled step kinds compile once each; the same kinds again compile nothing
    assert len(engine.programs.compiles) - compiled - first_compiles <= 2
    count = len(engine.programs.compiles)
    for generation in [engine.submit(prompt(m), max_tokens=3) for m in ("x", "yy", "zzz")]:
        tokens(generation)
    assert len(engine.programs.compiles) == count


def test_a_failed_step_fails_its_requests_and_the_engine_serves_on(engine, monkeypatch):
    expected = tokens(engine.submit(prompt("abc"), max_tokens=4))
    decode = engine.programs.decode
    calls = []

    def failing_once(*args, **named):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return decode(*args, **named)

    monkeypatch.setattr(engine.programs, "decode", failing_once)
    with pytest.raises(RuntimeError, match="decoding failed: out of memory"):
        tokens(engine.submit(prompt("abc"), max_tokens=4))
    assert tokens(engine.submit(prompt("abc"), max_tokens=4)) == expected
