"""GPT generation: cached decoding equals full recomputation, greedy, EOS, sampling, bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_reference import gpt_logits, reference_greedy

import zoo
from zoo.decoding import SamplingSettings, beam_generate
from zoo.decoding.generate import gpt_step, start_gpt_decoding

PAD = 0  # gpt-tiny: pad 0, bos 1, eos 2, 64 tokens, 128 positions
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]  # ragged: padded to width 5
NEW = 6  # one max_new_tokens for most tests: each new value compiles the loop again


def padded(prompts=PROMPTS):
    width = max(map(len, prompts))
    return np.array([p + [PAD] * (width - len(p)) for p in prompts], np.int32)


def test_cached_logits_equal_full_recomputation_for_ragged_prompts(gpt):
    prompts = jnp.asarray(padded())
    lengths = jnp.array([len(p) for p in PROMPTS], jnp.int32)
    continuation = np.array([[20, 21, 22], [30, 31, 32], [40, 41, 42]], np.int32)
    cache = eqx.filter_jit(start_gpt_decoding)(gpt, prompts, lengths, 8)
    step = eqx.filter_jit(gpt_step)
    feed = jnp.array([p[-1] for p in PROMPTS], jnp.int32)
    cached = []
    for t in range(4):
        logits, cache = step(gpt, feed, cache)
        cached.append(logits)
        if t < 3:
            feed = jnp.asarray(continuation[:, t])
    cached = np.stack(cached, axis=1)  # [batch, 4, vocab]
    for row, prompt in enumerate(PROMPTS):
        full = gpt_logits(gpt, prompt + continuation[row].tolist())
        expected = full[len(prompt) - 1 :]
        np.testing.assert_allclose(cached[row], expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(cache.index, lengths - 1 + 4)


def test_greedy_equals_argmax_of_the_full_forward_step_by_step(gpt):
    new = zoo.generate(gpt, jnp.asarray(padded()), max_new_tokens=NEW)
    assert new.shape == (3, NEW) and new.dtype == jnp.int32
    eos = gpt.config.eos_id
    for row, prompt in enumerate(PROMPTS):
        expected = reference_greedy(lambda n, p=prompt: gpt_logits(gpt, p + n)[-1], NEW, eos, PAD)
        assert new[row].tolist() == expected


def test_a_list_of_prompts_is_padded_like_the_array(gpt):
    from_list = zoo.generate(gpt, PROMPTS, max_new_tokens=NEW)
    from_array = zoo.generate(gpt, padded(), max_new_tokens=NEW)
    np.testing.assert_array_equal(from_list, from_array)


def test_explicit_lengths_keep_a_prompt_that_ends_with_the_pad_token(gpt):
    # Row 0 is [5, 6, 7, PAD]: its PAD is a real token here, so the continuation changes.
    new = zoo.generate(gpt, padded(), max_new_tokens=NEW, lengths=[4, 5, 2])
    default = zoo.generate(gpt, padded(), max_new_tokens=NEW)
    eos = gpt.config.eos_id
    expected = reference_greedy(lambda n: gpt_logits(gpt, [5, 6, 7, PAD, *n])[-1], NEW, eos, PAD)
    assert new[0].tolist() == expected
    assert new[0].tolist() != default[0].tolist()
    np.testing.assert_array_equal(new[1:], default[1:])


def test_eos_stops_each_sequence_independently(gpt):
    free_run = np.asarray(zoo.generate(gpt, PROMPTS, max_new_tokens=NEW))
    assert gpt.config.eos_id not in free_run  # so this run never stopped
    # Make the token that row 0 emits third the end token; same weights otherwise.
    eos = int(free_run[0, 2])
    stops = zoo.create("gpt-tiny", key=jax.random.key(1), eos_id=eos)
    stopped = np.asarray(zoo.generate(stops, PROMPTS, max_new_tokens=NEW))
    expected = []
    for row in free_run.tolist():
        end = row.index(eos) + 1 if eos in row else len(row)
        expected.append(row[:end] + [PAD] * (len(row) - end))
    np.testing.assert_array_equal(stopped, expected)
    ends = {row.index(eos) if eos in row else None for row in free_run.tolist()}
    assert len(ends) > 1, "the rows should end at different steps for this test to bite"


def test_generation_stops_on_any_of_several_end_ids(gpt):
    free_run = np.asarray(zoo.generate(gpt, PROMPTS, max_new_tokens=NEW)).tolist()
    # Two extra end ids (as Llama 3's <|eot_id|>, <|eom_id|>): what rows 0 and 1 emit second.
    stops = (free_run[0][1], free_run[1][1])
    model = zoo.create("gpt-tiny", key=jax.random.key(1), stop_ids=stops)
    assert model.config.end_ids == (gpt.config.eos_id, *stops)
    stopped = np.asarray(zoo.generate(model, PROMPTS, max_new_tokens=NEW))
    expected = []
    for row in free_run:
        end = min([row.index(s) + 1 for s in stops if s in row], default=len(row))
        expected.append(row[:end] + [PAD] * (len(row) - end))
    np.testing.assert_array_equal(stopped, expected)
    assert np.asarray(expected)[:2, 2:].tolist() == [[PAD] * (NEW - 2)] * 2
    beams = np.asarray(beam_generate(model, PROMPTS, max_new_tokens=NEW, beam_size=2)[0])
    for row in beams.tolist():  # beam search ends a hypothesis at any end id too
        ended = [i for i, t in enumerate(row) if t in model.config.end_ids]
        if ended:
            assert row[ended[0] + 1 :] == [PAD] * (NEW - ended[0] - 1)


def test_ragged_lists_need_no_pad_id_and_left_padding_needs_its_mask(gpt):
    no_pad = zoo.create("gpt-tiny", key=jax.random.key(1), pad_id=None)
    from_lists = zoo.generate(no_pad, PROMPTS, max_new_tokens=NEW)
    np.testing.assert_array_equal(from_lists, zoo.generate(gpt, PROMPTS, max_new_tokens=NEW))
    width = max(map(len, PROMPTS))
    left = np.array([[PAD] * (width - len(p)) + p for p in PROMPTS], np.int32)
    mask = (left != PAD).astype(np.int32)
    encoding = {"input_ids": left, "attention_mask": mask}  # as a tokenizer returns it
    from_left = zoo.generate(no_pad, encoding, max_new_tokens=NEW)
    np.testing.assert_array_equal(from_left, from_lists)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        zoo.generate(no_pad, {**encoding, "attention_mask": mask[:, 1:]}, max_new_tokens=NEW)
    with pytest.raises(ValueError, match="need 'input_ids'"):
        zoo.generate(no_pad, {"ids": left}, max_new_tokens=NEW)


def test_sampling_is_reproducible_and_respects_top_k(gpt):
    kwargs = dict(max_new_tokens=NEW, sampling=SamplingSettings(temperature=1.0, top_k=3))
    first = zoo.generate(gpt, PROMPTS, key=jax.random.key(7), **kwargs)
    again = zoo.generate(gpt, PROMPTS, key=jax.random.key(7), **kwargs)
    other = zoo.generate(gpt, PROMPTS, key=jax.random.key(8), **kwargs)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # every sampled token is among the 3 most likely given its own prefix
    eos = gpt.config.eos_id
    for row, prompt in enumerate(PROMPTS):
        new = first[row].tolist()
        end = new.index(eos) + 1 if eos in new else len(new)
        logits = gpt_logits(gpt, prompt + new[:end])
        for t in range(end):
            top3 = np.argsort(np.asarray(logits[len(prompt) - 1 + t]))[-3:]
            assert new[t] in top3


def test_new_sampling_numbers_do_not_recompile(gpt):
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    kwargs = dict(max_new_tokens=NEW, key=jax.random.key(0))
    zoo.generate(gpt, PROMPTS, sampling=SamplingSettings(1.0, top_k=3), **kwargs)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        other_prompts = [[9, 9], [3], [4, 4, 4, 4, 4]]
        zoo.generate(gpt, other_prompts, sampling=SamplingSettings(0.6, top_k=20), **kwargs)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []


@pytest.mark.parametrize(
    ("prompts", "kwargs", "error", "message"),
    [
        (PROMPTS, dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        ([[3] * 125], dict(max_new_tokens=4), ValueError, "max_positions=128"),
        ([[5, 6], []], dict(max_new_tokens=2), ValueError, "empty"),
        ([[5, 6], [PAD, PAD]], dict(max_new_tokens=2), ValueError, "empty"),
        (np.zeros((2, 0), np.int32), dict(max_new_tokens=2), ValueError, "empty"),
        (np.array([5, 6]), dict(max_new_tokens=2), ValueError, r"\[batch, seq\]"),
        (PROMPTS, dict(max_new_tokens=2, sampling=SamplingSettings(1.0)), ValueError, "key"),
        (PROMPTS, dict(max_new_tokens=2, sampling=0.8), TypeError, "SamplingSettings"),
        ([[5, 6, 7], [8, 99, 10, 11, 12], [13, 14]], dict(max_new_tokens=NEW), Exception, "vocab"),
    ],
)
def test_bad_requests_raise_clear_errors(gpt, prompts, kwargs, error, message):
    with pytest.raises(error, match=message):
        jax.block_until_ready(zoo.generate(gpt, prompts, **kwargs))


@pytest.mark.parametrize(
    "removed",
    [
        dict(temperature=1.3),
        dict(top_k=20),
        dict(top_p=0.9),
        dict(attention_mask=[[1, 1, 1]] * 3),
        dict(beam_size=3),
        dict(length_penalty=0.2),
        dict(rules=()),
        dict(temprature=1.0),
    ],
)
def test_a_keyword_outside_the_signature_is_refused(gpt, removed):
    """The older spellings (`sampling=`, a prompts mapping, `beam_generate`, a `Layout`) are
    refused like any other unknown keyword."""
    [name] = removed
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        zoo.generate(gpt, PROMPTS, max_new_tokens=2, **removed)


def test_generate_refuses_other_models(translator):
    with pytest.raises(TypeError, match="GPT"):
        zoo.generate(translator, PROMPTS, max_new_tokens=2)
