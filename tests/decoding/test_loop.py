"""The shared decoding loop on a stub model whose next token is scripted per sequence."""

import jax
import jax.numpy as jnp
import numpy as np

from zoo.decoding.loop import Stopping, fill_token, sample_loop

VOCAB, EOS, PAD = 8, 2, 0


def scripted_step(script):
    """Step `t` of sequence `b` puts all mass on `script[b, t]`; the state counts steps."""

    def step(tokens, counter):
        next_tokens = jnp.take_along_axis(script, counter[:, None], axis=1)[:, 0]
        logits = 10.0 * jax.nn.one_hot(next_tokens, VOCAB)
        return logits, counter + 1

    return step


def run(script, max_new_tokens):
    script = jnp.asarray(script, jnp.int32)
    batch = script.shape[0]
    return jax.jit(
        lambda: sample_loop(
            scripted_step(script),
            jnp.zeros((batch,), jnp.int32),
            jnp.full((batch,), 1, jnp.int32),
            stopping=Stopping(max_new_tokens, eos_id=EOS, fill_id=PAD),
        )
    )()


def test_each_sequence_stops_at_its_own_eos_and_the_loop_exits_when_all_have():
    script = [
        [5, EOS, 6, 6, 6, 6, 6, 6],
        [4, 4, 4, EOS, 7, 7, 7, 7],
        [3, 3, 3, 3, 3, 3, 3, 3],
    ]
    tokens, steps = run(script, 6)
    np.testing.assert_array_equal(
        tokens,
        [
            [5, EOS, PAD, PAD, PAD, PAD],
            [4, 4, 4, EOS, PAD, PAD],
            [3, 3, 3, 3, 3, 3],
        ],
    )
    assert int(steps) == 6

    tokens, steps = run(script[:2], 6)
    assert int(steps) == 4  # both ended by step 4: no more model calls
    np.testing.assert_array_equal(tokens[1], [4, 4, 4, EOS, PAD, PAD])


def test_fill_token_prefers_pad_then_eos():
    assert fill_token(0, 2) == 0
    assert fill_token(None, 50256) == 50256
    assert fill_token(None, None) == 0
