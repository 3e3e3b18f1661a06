"""Generation and translation on 8 (forced CPU) devices give the tokens of one device.

Run through tests/distributed/test_forced_devices.py. The model is placed by the partition
rules, the prompts split by rows over data x fsdp (4 rows: one per slice), and the KV cache
stays split inside the compiled loop. Each case compiles a decoding loop, which is most of the
time, so the cases are few and the shapes tiny.
"""

from __future__ import annotations

import functools
import re
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import zoo
from tests.distributed.forced.test_sharded_training import CUBE
from zoo.decoding.generate import gpt_step, last_tokens, start_gpt_decoding
from zoo.decoding.placement import decoding_layout, place_model, place_rows
from zoo.decoding.translate import start_translation, translator_step

NEW = 6  # tokens generated per prompt
generate_module = sys.modules["zoo.decoding.generate"]  # `zoo.decoding.generate` is the function


@functools.cache
def model(preset: str):
    return zoo.create(preset, key=jax.random.key(0))


LENGTHS = np.array([5, 3, 4, 2], np.int32)


def prompts(rows: int) -> np.ndarray:
    """`rows` (at most 4) prompts of `LENGTHS` tokens, right-padded with pad_id 0."""
    batch = np.random.default_rng(1).integers(3, 60, (rows, 5)).astype(np.int32)
    for row, length in enumerate(LENGTHS[:rows]):
        batch[row, length:] = 0
    return batch


@eqx.filter_jit
def first_gpt_logits(gpt, batch, lengths):
    caches = start_gpt_decoding(gpt, batch, lengths, batch.shape[1])
    return gpt_step(gpt, last_tokens(batch, lengths), caches)[0]


@eqx.filter_jit
def first_translator_logits(translator, sources):
    memory, caches = start_translation(translator, sources, NEW)
    bos = jnp.full((sources.shape[0],), translator.config.bos_id, jnp.int32)
    return translator_step(translator, memory, bos, caches)[0]


def test_placement_splits_rows_that_divide_and_copies_the_others_whole():
    layout = decoding_layout(CUBE)
    four, three = place_rows(layout, prompts(4), prompts(3))
    assert four.sharding.spec == P(("data", "fsdp"), None)
    assert four.addressable_shards[0].data.shape == (1, 5)
    assert three.sharding.is_fully_replicated
    gpt = model("llama-tiny")
    placed = place_model(layout, gpt)
    assert placed.layers.blocks.self_attention.key_proj.weight.sharding.spec == P(
        None, "tensor", "fsdp"
    )
    assert place_model(layout, placed) is placed  # already there: not copied again


def test_gpt_on_a_mesh_generates_the_tokens_of_one_device():
    """llama-tiny: the GPT class with grouped-query heads (2 key/value heads, 1 per tensor
    slice), rotary positions, RMSNorm and SwiGLU; gpt-tiny runs in the cases below."""
    gpt, batch = model("llama-tiny"), prompts(4)
    np.testing.assert_array_equal(
        zoo.generate(gpt, batch, max_new_tokens=NEW, mesh=CUBE),
        zoo.generate(gpt, batch, max_new_tokens=NEW),
    )
    beam_one, scores_one = zoo.decoding.beam_generate(gpt, batch, max_new_tokens=NEW, beam_size=3)
    beam_many, scores_many = zoo.decoding.beam_generate(
        gpt, batch, max_new_tokens=NEW, beam_size=3, mesh=CUBE
    )
    np.testing.assert_array_equal(beam_many, beam_one)
    np.testing.assert_allclose(scores_many, scores_one, rtol=0, atol=1e-5)
    layout = decoding_layout(CUBE)
    one = first_gpt_logits(gpt, jnp.asarray(batch), jnp.asarray(LENGTHS))
    many = first_gpt_logits(place_model(layout, gpt), *place_rows(layout, batch, LENGTHS))
    assert many.sharding.spec[0] == ("data", "fsdp")  # the logits stay split by rows
    np.testing.assert_allclose(many, one, rtol=0, atol=1e-5)


def test_sampling_on_a_mesh_draws_the_tokens_of_one_device():
    gpt, batch, key = model("gpt-tiny"), prompts(4), jax.random.key(7)
    sampling = zoo.SamplingSettings(temperature=1.0, top_k=20)
    options = dict(max_new_tokens=NEW, sampling=sampling, key=key)
    one = np.asarray(zoo.generate(gpt, batch, **options))
    np.testing.assert_array_equal(zoo.generate(gpt, batch, mesh=CUBE, **options), one)
    assert len(np.unique(one)) > 4  # really sampled, not one repeated token


def test_a_batch_that_does_not_split_is_generated_whole_on_every_device():
    gpt, batch = model("gpt-tiny"), prompts(3)  # 3 rows over data x fsdp = 4 slices
    np.testing.assert_array_equal(
        zoo.generate(gpt, batch, max_new_tokens=NEW, mesh="fsdp=8"),
        zoo.generate(gpt, batch, max_new_tokens=NEW),
    )


def compiled_text(function, *args) -> str:
    return function.lower(*args).compile().compiled.as_text()


def test_the_kv_cache_stays_split_by_rows_and_heads_in_the_compiled_loop():
    """Per device the loop carries 1 of the 4 rows and 1 of llama-tiny's 2 key/value heads;
    beam search's 12 rows (4 prompts x 3 beams) are never gathered onto one device."""
    layout = decoding_layout(CUBE)
    gpt = place_model(layout, model("llama-tiny"))
    batch, lengths = place_rows(layout, prompts(4), LENGTHS)
    greedy = compiled_text(generate_module._generate, gpt, batch, lengths, NEW, None, None, None)
    loops = [line for line in greedy.splitlines() if " while(" in line]
    # keys/values [rows, layers, positions, kv_heads, head_dim]: positions = 5 + NEW - 1
    carried = set(re.findall(r"f32\[(\d+),2,10,(\d+),16\]", " ".join(loops)))
    assert carried == {("1", "1")}
    beam_search = generate_module.Beam(3, 0.6)
    beam = compiled_text(
        generate_module._generate, gpt, batch, lengths, NEW, beam_search, None, None
    )
    gathered = re.findall(r"= f32\[(\d+),2,10,\d+,16\]\S* all-gather\(", beam)
    assert gathered == []  # reordering the beams over all rows gathered [12, 2, 10, 1, 16]


def test_translator_on_a_mesh_translates_as_one_device():
    translator, sources = model("translator-tiny"), prompts(4)
    np.testing.assert_array_equal(
        zoo.translate(translator, sources, max_len=NEW, mesh=CUBE),
        zoo.translate(translator, sources, max_len=NEW),
    )
    beam_one, scores_one = zoo.decoding.beam_translate(
        translator, sources, max_len=NEW, beam_size=3
    )
    beam_many, scores_many = zoo.decoding.beam_translate(
        translator, sources, max_len=NEW, beam_size=3, mesh=CUBE
    )
    np.testing.assert_array_equal(beam_many, beam_one)
    np.testing.assert_allclose(scores_many, scores_one, rtol=0, atol=1e-5)
    layout = decoding_layout(CUBE)
    one = first_translator_logits(translator, jnp.asarray(sources))
    many = first_translator_logits(place_model(layout, translator), *place_rows(layout, sources))
    np.testing.assert_allclose(many, one, rtol=0, atol=1e-5)
