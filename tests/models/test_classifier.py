import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.classifier import ClassifierHead, Pooler
from zoo.nn import NormSettings

TOKENS = jnp.array([7, 12, 30, 4, 9])


@pytest.mark.parametrize(
    "overrides",
    [
        {"head.pooling": "mean"},
        {"head": ClassifierHead(pooling="first")},
        {"norm_first": False, "embedder.norm": NormSettings(), "head": ClassifierHead()},
    ],
)
def test_appending_padding_leaves_output_unchanged(key, overrides):
    clf = zoo.create("classifier-tiny", key=key, **overrides)
    padded = jnp.concatenate([TOKENS, jnp.zeros(4, TOKENS.dtype)])
    np.testing.assert_allclose(clf(padded), clf(TOKENS), atol=1e-5)


def test_explicit_mask_overrides_pad_id(key):
    clf = zoo.create("classifier-tiny", key=key)
    padded = jnp.concatenate([TOKENS, jnp.array([50, 51])])  # real ids, marked as padding
    mask = jnp.array([True] * 5 + [False] * 2)
    np.testing.assert_allclose(clf(padded, mask), clf(TOKENS), atol=1e-5)


def test_mean_pooling_by_hand(key):
    clf = zoo.create("classifier-tiny", key=key)
    hidden = clf.encode(jnp.concatenate([TOKENS, jnp.zeros(2, TOKENS.dtype)]))
    pooled = clf.pool(hidden, jnp.array([True] * 5 + [False] * 2))
    np.testing.assert_allclose(pooled, np.asarray(hidden[:5]).mean(0), atol=1e-6)


def test_vmap_equals_loop_and_num_classes_override(key):
    clf = zoo.create("classifier-tiny", num_classes=5, key=key)
    batch = jnp.stack([TOKENS, TOKENS[::-1]])
    out = jax.vmap(clf)(batch)
    assert out.shape == (2, 5)
    np.testing.assert_allclose(out[1], clf(batch[1]), atol=1e-6)


def test_fully_padded_input_gives_finite_output_and_gradient(key):
    clf = zoo.create("classifier-tiny", key=key)
    pads = jnp.zeros(6, jnp.int32)

    def loss(model):
        return jnp.sum(model(pads) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(clf)
    assert np.isfinite(float(value))
    assert all(
        bool(jnp.all(jnp.isfinite(g)))
        for g in jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array))
    )


def test_token_types(key):
    clf = zoo.create("bert-base", num_layers=1, key=key)
    tokens = jnp.array([101, 2000, 102, 3000, 102])
    types = jnp.array([0, 0, 0, 1, 1])
    assert not np.allclose(clf(tokens, token_types=types), clf(tokens))
    with pytest.raises(Exception, match=r"token type id outside \[0, 2\)"):
        clf(tokens, token_types=types.at[0].set(2))


def test_position_offset_counts_real_tokens_from_the_offset(key):
    """RoBERTa: real tokens sit at offset, offset + 1, ...; left padding shifts nothing."""
    model = zoo.create("classifier-tiny", pad_id=1, key=key, **{"embedder.position_offset": 2})
    plain = zoo.create("classifier-tiny", pad_id=1, key=key)  # the same weights, offset 0
    table = plain.embedder.position_weight
    shifted = eqx.tree_at(lambda m: m.embedder.position_weight, plain, jnp.roll(table, -2, 0))
    tokens = jnp.array([0, 5, 6, 9])
    np.testing.assert_allclose(model.encode(tokens), shifted.encode(tokens), atol=1e-5)
    padded = model.encode(jnp.array([1, 1, 0, 5, 6, 9]))[2:]
    np.testing.assert_allclose(padded, model.encode(tokens), atol=1e-5)
    assert model.config.max_tokens == 126
    with pytest.raises(ValueError, match="max_positions=126"):
        model(jnp.zeros(127, jnp.int32))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("embedder.position_offset", 128, "position_offset must be in"),
        ("head.pooler", {"activation": "sigmoid"}, "pooler activation must be one of"),
    ],
)
def test_bad_encoder_fields_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        zoo.presets.config("classifier-tiny", **{field: value})


def test_relu_pooler_is_distilberts_head(key):
    head = ClassifierHead(pooling="mean", pooler=Pooler(activation="relu"))
    model = zoo.create("classifier-tiny", head=head, key=key)
    hidden = jnp.ones((3, 64)) * jnp.arange(64.0)[None] / 64 - 0.5
    expected = jax.nn.relu(model.pooler(jnp.mean(hidden, axis=0)))
    assert jnp.allclose(model.pool(hidden, None), expected)
