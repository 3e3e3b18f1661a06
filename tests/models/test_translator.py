import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.translator import TranslatorHead
from zoo.nn import RelativePositions

SRC = jnp.array([5, 8, 13, 21, 2])
TGT = jnp.array([1, 9, 10, 11])


# T5's parts on translator-tiny's shapes: relative positions (few buckets, so that this short
# a sequence reaches the logarithmic ones), unscaled scores, RMSNorm, no biases, gated GELU
T5_PARTS = {
    "embedder.positions": "none",
    "relative": RelativePositions(num_buckets=8, max_distance=8),
    "attention.scale_dim": 1.0,
    "cross_attention.scale_dim": 1.0,
    "norm.kind": "rmsnorm",
    "attention.qkv_bias": False,
    "attention.output_bias": False,
    "cross_attention.qkv_bias": False,
    "cross_attention.output_bias": False,
    "feed_forward.bias": False,
    "feed_forward.kind": "gated",
    "feed_forward.activation": "gelu_tanh",
    "embedder.scale": False,
    "head.tie": False,
    "final_dropout": True,
    "init_std": 0.1,
}


@pytest.fixture(scope="module", params=["paper", "t5"])
def translator(request):
    overrides = T5_PARTS if request.param == "t5" else {}
    return zoo.create("translator-tiny", key=jax.random.key(0), **overrides)


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
    untied = zoo.create("translator-tiny", head=TranslatorHead(tie=False, bias=True), key=key)
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


def test_relative_positions_are_a_shared_score_bias():
    model = zoo.create("translator-tiny", key=jax.random.key(0), **T5_PARTS)
    assert model.encoder_position_bias.weight.shape == (8, 4)  # [buckets, heads]
    assert model.decoder_position_bias.weight.shape == (8, 4)
    assert model.encoder_position_bias.bidirectional is True  # the encoder looks both ways
    assert model.decoder_position_bias.bidirectional is False
    assert model.source_embedder.position_weight is None  # nothing added to the embeddings
    # the bias is used: changing either table changes the logits
    for side in ("encoder_position_bias", "decoder_position_bias"):
        changed = eqx.tree_at(lambda m, s=side: getattr(m, s).weight, model, jnp.zeros((8, 4)))
        assert float(jnp.max(jnp.abs(changed(SRC, TGT) - model(SRC, TGT)))) > 1e-3


def test_scale_output_rescales_a_tied_head_by_d_model():
    plain = zoo.create("translator-tiny", key=jax.random.key(0))
    scaled = zoo.create("translator-tiny", **{"head.scale": True}, key=jax.random.key(0))
    np.testing.assert_allclose(scaled(SRC, TGT), plain(SRC, TGT) / 8.0, rtol=1e-5, atol=1e-7)


def test_final_dropout_acts_only_with_a_key():
    with_final = zoo.create(
        "translator-tiny", dropout=0.5, final_dropout=True, key=jax.random.key(0)
    )
    without = zoo.create("translator-tiny", dropout=0.5, key=jax.random.key(0))
    assert with_final.final_dropout.rate == 0.5 and without.final_dropout.rate == 0.0
    np.testing.assert_allclose(with_final(SRC, TGT), without(SRC, TGT), atol=1e-6)
    key = jax.random.key(1)
    assert float(jnp.max(jnp.abs(with_final(SRC, TGT, key=key) - without(SRC, TGT, key=key)))) > 0


@pytest.mark.parametrize(
    ("flavor", "fields", "message"),
    [
        (
            "gpt-tiny",
            dict(relative=dict(num_buckets=32)),
            "implemented for zoo.Translator only, not GPTConfig",
        ),
        ("translator-tiny", dict(final_dropout=True, norm_first=False), "set norm_first=True"),
        (
            "translator-tiny",
            {"embedder.positions": "none", "relative": dict(num_buckets=2)},
            "num_buckets=2 is too few",
        ),
        (
            "translator-tiny",
            {"embedder.positions": "none", "relative": dict(num_buckets=32, max_distance=8)},
            "max_distance=8 must exceed the exact buckets",
        ),
    ],
)
def test_relative_position_fields_are_checked(flavor, fields, message):
    with pytest.raises(ValueError, match=message):
        zoo.presets.config(flavor, **fields)
