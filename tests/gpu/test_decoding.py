"""KV-cached generation equals recomputing the prefix, in float32, and decoding never recompiles.

Part of the GPU suite, and cheap enough to run on the CPU in the normal suite too: on a GPU it
checks the same contract under the GPU's kernels (float32 matmuls at "highest" precision, so
TF32 cannot blur a greedy choice).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.bench.run_zoo import make_greedy_decode
from zoo.bench.timing import BACKEND_COMPILE_EVENT, CompileClock
from zoo.decoding.generate import gpt_step, start_gpt_decoding

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14]]  # ragged, right-padded with pad_id 0
NEW = 12
WIDTH = 6 + NEW  # the uncached reference runs at one width: one compile


@pytest.fixture(scope="module")
def gpt():
    # eos off: every sequence generates all NEW tokens, so the greedy paths are compared whole
    return zoo.create("gpt-tiny", eos_id=None, key=jax.random.key(3))


def padded() -> tuple[jax.Array, jax.Array]:
    rows = [p + [0] * (6 - len(p)) for p in PROMPTS]
    return jnp.asarray(rows, jnp.int32), jnp.asarray([len(p) for p in PROMPTS], jnp.int32)


@eqx.filter_jit
def full_logits(model, tokens):
    """Uncached: one forward over the whole (padded) sequence; causality hides the tail."""
    return model(tokens, jnp.ones(tokens.shape, bool))


def recomputed_greedy(model, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and their logits, recomputing the whole prefix at every step."""
    sequence, logits = list(prompt), []
    for _ in range(NEW):
        row = full_logits(model, jnp.asarray(sequence + [0] * (WIDTH - len(sequence))))
        logits.append(np.asarray(row[len(sequence) - 1]))
        sequence.append(int(np.argmax(logits[-1])))
    return sequence[len(prompt) :], np.stack(logits)


def test_cached_generation_equals_recomputing_the_prefix_in_float32(gpt):
    prompts, lengths = padded()
    with jax.default_matmul_precision("highest"):
        generated = np.asarray(zoo.generate(gpt, prompts, lengths=lengths, max_new_tokens=NEW))
        # the cached logits, step by step, for the same greedy tokens
        caches = eqx.filter_jit(start_gpt_decoding)(gpt, prompts, lengths, WIDTH)
        step = eqx.filter_jit(gpt_step)
        feed = jnp.asarray([p[-1] for p in PROMPTS], jnp.int32)
        cached = []
        for t in range(NEW):
            logits, caches = step(gpt, feed, caches)
            cached.append(np.asarray(logits))
            feed = jnp.asarray(generated[:, t])
        references = [recomputed_greedy(gpt, prompt) for prompt in PROMPTS]
    cached_logits = np.stack(cached, axis=1)  # [batch, NEW, vocab]
    for row, (tokens, logits) in enumerate(references):
        assert generated[row].tolist() == tokens
        np.testing.assert_allclose(cached_logits[row], logits, atol=1e-4, rtol=0)


def backend_compiles(clock: CompileClock) -> int:
    return sum(event == BACKEND_COMPILE_EVENT for event, _, _ in clock.spans)


def test_decode_steps_do_not_recompile(gpt):
    """One compile for the first step; none for the next steps, new tokens or a new batch."""
    prompts, lengths = padded()
    caches = eqx.filter_jit(start_gpt_decoding)(gpt, prompts, lengths, WIDTH)
    step = eqx.filter_jit(gpt_step)
    feed = jnp.asarray([p[-1] for p in PROMPTS], jnp.int32)
    with CompileClock() as first:
        logits, caches = step(gpt, feed, caches)
        feed = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    assert backend_compiles(first) >= 1
    with CompileClock() as later:
        for _ in range(NEW - 1):
            logits, caches = step(gpt, feed, caches)
            feed = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        jax.block_until_ready(caches)
    assert backend_compiles(later) == 0
    np.testing.assert_array_equal(caches.index, lengths - 1 + NEW)


def test_generate_and_the_bench_decoder_compile_once_per_shape(gpt):
    prompts, lengths = padded()
    decode = make_greedy_decode(prompt_len=6, new_tokens=NEW, precision="fp32")
    with jax.numpy_dtype_promotion("standard"):
        decode(gpt, prompts)  # compiles
        zoo.generate(gpt, prompts, lengths=lengths, max_new_tokens=NEW)
        other = (prompts + 7) % gpt.config.vocab_size
        with CompileClock() as clock:
            jax.block_until_ready(decode(gpt, other))
            jax.block_until_ready(zoo.generate(gpt, other, lengths=lengths, max_new_tokens=NEW))
    assert backend_compiles(clock) == 0
