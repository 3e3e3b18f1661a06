import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo

SRC = jnp.array([5, 8, 13, 21, 2])
TGT = jnp.array([1, 9, 10, 11])


@pytest.fixture(scope="module")
def translator():
    return zoo.create("translator-tiny", key=jax.random.key(0))


def test_encode_then_decode_equals_call(translator):
    memory = translator.encode(SRC)
    assert memory.shape == (5, 64)
    np.testing.assert_allclose(translator.decode(TGT, memory), translator(SRC, TGT), atol=1e-5)


def test_decoder_is_causal(translator):
    changed = TGT.at[3].set(40)
    np.testing.assert_allclose(translator(SRC, TGT)[:3], translator(SRC, changed)[:3], atol=1e-6)


def test_source_padding_invariance(translator):
    padded = jnp.concatenate([SRC, jnp.zeros(3, SRC.dtype)])
    np.testing.assert_allclose(translator(padded, TGT), translator(SRC, TGT), atol=1e-5)


def test_target_padding_leaves_real_positions_unchanged(translator):
    padded = jnp.concatenate([TGT, jnp.zeros(2, TGT.dtype)])
    np.testing.assert_allclose(translator(SRC, padded)[:4], translator(SRC, TGT), atol=1e-5)


def test_incremental_decoding_equals_teacher_forcing(translator):
    state = translator.start_decoding(SRC, 8)
    steps = []
    for token in TGT:
        logits, state = translator.decode_step(token[None], state)
        steps.append(logits[0])
    np.testing.assert_allclose(jnp.stack(steps), translator(SRC, TGT), atol=1e-5)


def test_shared_and_separate_vocabularies(key):
    shared = zoo.create("translator-tiny", key=key)
    assert shared.target_embedder.token_weight is None
    separate = zoo.create("translator-tiny", target_vocab_size=40, share_embeddings=False, key=key)
    assert separate(SRC, TGT).shape == (4, 40)
    with pytest.raises(Exception, match=r"tgt id outside \[0, 40\)"):
        separate(SRC, TGT.at[1].set(50))
    untied = zoo.create("translator-tiny", tie_output=False, output_bias=True, key=key)
    assert untied.output_proj is not None and untied.output_bias.shape == (64,)


def test_fully_padded_source_is_finite(translator):
    def loss(model):
        return jnp.sum(model(jnp.zeros(4, jnp.int32), TGT) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(translator)
    assert np.isfinite(float(value))
    assert all(
        bool(jnp.all(jnp.isfinite(g)))
        for g in jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array))
    )


def test_attention_maps_shapes(translator):
    maps = translator.attention_maps(SRC, TGT)
    assert maps["encoder"].shape == (2, 4, 5, 5)
    assert maps["decoder"].shape == (2, 4, 4, 4)
    assert maps["cross"].shape == (2, 4, 4, 5)
    np.testing.assert_allclose(maps["cross"].sum(-1), 1.0, atol=1e-5)


def test_vmap_over_pairs(translator):
    src = jnp.stack([SRC, SRC[::-1]])
    tgt = jnp.stack([TGT, TGT])
    out = jax.vmap(translator)(src, tgt)
    np.testing.assert_allclose(out[1], translator(src[1], tgt[1]), atol=1e-5)
