"""The rotary table: cos/sin made once per forward pass and handed to every layer.

A layer given the table rotates exactly as one that makes its own from the positions; a whole
Llama-style GPT (left and right padding, linear and llama3 scaling, QK-norm, sliding window,
scanned or unrolled, cached decoding) gives the logits of the same layer loop with each layer
computing its own angles; and the compiled train step evaluates no sine or cosine inside its
layer loops (forward, and the backward pass's recomputation).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.bench.hlo_ops import Program, parse_program
from zoo.models.common import token_positions, valid_positions
from zoo.nn import (
    AttentionSettings,
    BlockInputs,
    KVCache,
    Mask,
    MultiHeadAttention,
    QKNorm,
    Rope,
    RotaryEmbedding,
    RotaryTable,
    apply_rotary,
)
from zoo.nn.layer_loop import REMAT_POLICIES, scans
from zoo.nn.rotary import rotate_half

TOKENS = jnp.array(
    [[0, 0, 5, 9, 3, 12, 7, 30, 4, 8, 21, 6], [5, 9, 3, 12, 7, 30, 4, 8, 21, 6, 0, 0]]
)


def test_the_table_rotates_as_the_positions_do(key):
    rope = Rope(theta=500.0, scaling="llama3", factor=8.0, original_max_positions=4)
    rotary = RotaryEmbedding(8, rope)
    positions = jnp.array([3, 0, 7, 7, 2])
    table = rotary.table(positions)
    assert table.cos.shape == table.sin.shape == (5, 8)
    assert table.cos.dtype == table.sin.dtype == jnp.float32
    # each pair's angle twice: position * inverse frequency
    angles = np.asarray(positions, np.float32)[:, None] * rotary.inverse_frequencies()[None, :]
    cos, sin = (
        np.cos(np.concatenate([angles, angles], -1)),
        np.sin(np.concatenate([angles] * 2, -1)),
    )
    np.testing.assert_allclose(table.cos, cos, atol=1e-6)
    x = jax.random.normal(key, (5, 3, 8))
    expected = np.asarray(x) * cos[:, None] + np.asarray(rotate_half(x)) * sin[:, None]
    np.testing.assert_allclose(rotary(x, table), expected, atol=1e-5)
    np.testing.assert_array_equal(apply_rotary(x, table), rotary(x, table))
    # bf16 heads rotate in float32 and come back bf16
    half = x.astype(jnp.bfloat16)
    assert rotary(half, table).dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(rotary(half, table), np.float32), expected, atol=0.05, rtol=0.02
    )


def test_a_table_of_other_positions_is_refused(key):
    rotary = RotaryEmbedding(8)
    x = jax.random.normal(key, (5, 2, 8))
    with pytest.raises(ValueError, match=r"needs \(5, 8\).*RotaryEmbedding.table"):
        rotary(x, rotary.table(jnp.arange(4)))
    rotating = MultiHeadAttention(16, AttentionSettings(num_heads=2, rope=Rope()), key=key)
    with pytest.raises(ValueError, match="pass the rotary table of the positions"):
        rotating.project_query(jnp.ones((5, 16)))
    plain = MultiHeadAttention(16, AttentionSettings(num_heads=2), key=key)
    assert plain.rotary_table(jnp.arange(4)) is None


def test_a_block_with_the_table_equals_a_block_without(key):
    model = zoo.create("llama-tiny", key=key, **{"attention.qk_norm": QKNorm()})
    block = model.layers.layer(1)
    x = jax.random.normal(key, (6, model.config.d_model))
    positions = jnp.array([0, 0, 0, 1, 2, 3])  # two left pads
    table = block.self_attention.rotary_table(positions)
    assert isinstance(table, RotaryTable)
    mask = Mask(causal=True)

    @eqx.filter_jit
    def both(block, table):
        attention = block.self_attention
        keys, values = attention.project_key_value(x, table)
        return (
            block(x, BlockInputs(mask=mask, rotary=table))[0],
            block(x, BlockInputs(mask=mask, positions=positions))[0],
            attention.attend(attention.project_query(x, table), keys, values, mask)[0],
            attention(x, mask=mask, positions=positions),
        )

    with_table, own_table, attention_with, attention_own = both(block, table)
    np.testing.assert_allclose(with_table, own_table, rtol=0, atol=1e-6)
    np.testing.assert_allclose(attention_with, attention_own, rtol=0, atol=1e-6)
    assert float(jnp.max(jnp.abs(attention_own))) > 1e-3


def own_angles(model, x, **kwargs):
    """The layer stack with every layer making its own rotary table from `kwargs`: scanned and
    recomputed like `LayerStack` (the same program but for the angles) or one by one."""
    params, static = eqx.partition(model.layers.blocks, eqx.is_array)

    def body(h, block_params):
        return eqx.combine(block_params, static)(h, BlockInputs(**kwargs))[0], None

    if model.config.remat is not None:
        body = jax.checkpoint(body, policy=REMAT_POLICIES[model.config.remat])
    if scans(model.config.scan_layers):
        return jax.lax.scan(body, x, params)[0]
    for index in range(model.config.num_layers):
        x, _ = model.layers.layer(index)(x, BlockInputs(**kwargs))
    return x


def per_layer_logits(model, tokens):
    """The forward of `zoo.GPT` with each layer computing its own rotary angles from the
    positions (how every layer rotated before the table was made once)."""
    c = model.config
    key_valid = valid_positions(tokens, c.pad_id, None)
    positions = token_positions(key_valid, tokens.shape[0])
    num_tokens = tokens.shape[0]
    explicit = None if key_valid is None else jnp.broadcast_to(key_valid, (num_tokens, num_tokens))
    mask = Mask(causal=True, explicit=explicit)  # each layer's attention adds its window
    x = model.embedder(tokens, positions)
    return model._logits(own_angles(model, x, mask=mask, positions=positions))


def per_layer_extend(model, tokens, cache: KVCache):
    """`GPT.extend`'s logits with each layer making its table from the cache index."""
    positions = cache.index + jnp.arange(tokens.shape[0])
    mask = Mask(causal=True, offset=cache.index)
    params, static = eqx.partition(model.layers.blocks, eqx.is_array)

    def body(carry, layer_params):  # the stack's cached scan, with each layer making its table
        h, keys, values, layer = carry
        block = eqx.combine(layer_params, static)
        layer_cache = KVCache(keys[layer], values[layer], cache.index)
        h, extras = block(h, BlockInputs(mask=mask, cache=layer_cache))
        keys = keys.at[layer].set(extras.cache.keys)
        values = values.at[layer].set(extras.cache.values)
        return (h, keys, values, layer + 1), None

    x = model.embedder(tokens, positions)
    if scans(model.config.scan_layers):
        first = jnp.zeros((), jnp.int32)
        (x, _, _, _), _ = jax.lax.scan(body, (x, cache.keys, cache.values, first), params)
    else:
        for index in range(model.config.num_layers):
            x, _ = model.layers.layer(index)(x, BlockInputs(mask=mask, cache=cache.layer(index)))
    return model._logits(x)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "attention.rope": Rope(scaling="llama3", factor=8.0, original_max_positions=8),
            "attention.qk_norm": QKNorm(),
            "attention.window": 5,
        },
        {
            "attention.rope": Rope(scaling="linear", factor=2.0),
            "layer_loop": "unroll",
            "remat": None,
        },
    ],
    ids=["llama-tiny", "llama3-qknorm-window", "linear-unrolled"],
)
def test_gpt_logits_equal_the_per_layer_angles(overrides):
    model = zoo.create("llama-tiny", key=jax.random.key(3), init_std=0.2, **overrides)
    ours = jax.vmap(model)(TOKENS)  # left- and right-padded rows (pad_id=0)
    reference = jax.vmap(lambda t: per_layer_logits(model, t))(TOKENS)
    assert float(jnp.max(jnp.abs(reference))) > 0.5  # logits that rotation changes visibly
    # every real token's logits; a padding position's are unspecified (the model runs the real
    # tokens first, zoo.nn.Compaction, so its padding sees other keys than the reference's)
    real = np.asarray(TOKENS != 0)
    np.testing.assert_allclose(
        np.asarray(ours)[real], np.asarray(reference)[real], rtol=0, atol=1e-6
    )
    # cached decoding: a prompt of 7 then one token at a time, positions from the cache index
    tokens = TOKENS[1, :10]
    cache = model.init_cache(10)
    logits, cache = model.extend(tokens[:7], cache)
    for index in range(7, 10):
        expected = per_layer_extend(model, tokens[index : index + 1], cache)
        logits, cache = model.extend(tokens[index : index + 1], cache)
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-6)


def loop_opcodes(program: Program) -> set[str]:
    """Opcodes of every while loop's body and condition and of all they call (fusions, ...)."""
    loops = [instruction for instruction in program.instructions.values()
             if instruction.opcode == "while"]  # fmt: skip
    return program.reach([name for loop in loops for name in loop.calls])[0]


def test_the_train_step_evaluates_no_sine_or_cosine_in_its_layer_loops():
    """llama-tiny scans its layers and recomputes elementwise work in the backward pass
    (remat="dots"): the table is made once, before the loops, not per layer, pass and head."""
    model = zoo.create("llama-tiny", key=jax.random.key(0))
    assert scans(model.config.scan_layers) and model.config.remat == "dots"
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling())
    state = trainer.init_optimizer(model)
    lowered = trainer.train_step.lower(model, state, {"tokens": TOKENS}, jax.random.key(1), 1)
    program = parse_program(lowered.compile().compiled.as_text())
    whiles = [i for i in program.instructions.values() if i.opcode == "while"]
    assert len(whiles) >= 2  # the forward scan and the backward one
    everything = {i.opcode for i in program.instructions.values()}
    assert {"sine", "cosine"} <= everything  # the table, from the token positions (padding)
    assert not {"sine", "cosine"} & loop_opcodes(program)

    # the same analysis finds them in the loops of a gradient whose layers make their own
    @eqx.filter_jit
    @eqx.filter_grad
    def per_layer_gradient(model, x, positions):
        return jnp.sum(own_angles(model, x, positions=positions))

    x = jnp.ones((TOKENS.shape[1], model.config.d_model))
    lowered = per_layer_gradient.lower(model, x, jnp.arange(TOKENS.shape[1]))
    assert {"sine", "cosine"} <= loop_opcodes(parse_program(lowered.compile().compiled.as_text()))
