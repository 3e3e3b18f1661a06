import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.models.common import check_tokens
from zoo.models.gpt import LMHead


@pytest.fixture(scope="module")
def gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(0))


TOKENS = jnp.array([5, 9, 17, 3, 44, 8])


def test_shapes_and_vmap_equals_loop(gpt):
    batch = jnp.stack([TOKENS, TOKENS[::-1], TOKENS + 1])
    batched = jax.vmap(gpt)(batch)
    assert batched.shape == (3, 6, 64)
    for i in range(3):
        np.testing.assert_allclose(batched[i], gpt(batch[i]), atol=1e-5)


def test_causality_future_token_changes_no_earlier_logit(gpt):
    changed = TOKENS.at[4].set(60)
    before, after = gpt(TOKENS), gpt(changed)
    np.testing.assert_allclose(before[:4], after[:4], atol=1e-6)
    assert not np.allclose(before[4:], after[4:])


def test_appending_padding_leaves_real_logits_unchanged(gpt):
    padded = jnp.concatenate([TOKENS, jnp.zeros(3, TOKENS.dtype)])  # pad_id = 0
    np.testing.assert_allclose(gpt(padded)[:6], gpt(TOKENS), atol=1e-5)


def test_tied_head_is_the_token_embedding(gpt):
    assert gpt.head is None
    scaled = eqx.tree_at(lambda m: m.embedder.token_weight, gpt, gpt.embedder.token_weight * 0)
    # zero embeddings: the tied head gives zero logits everywhere
    np.testing.assert_allclose(scaled(TOKENS), 0.0, atol=1e-6)


def test_untied_head(key):
    model = zoo.create("gpt-tiny", head=LMHead(tie=False), key=key)
    assert model.head is not None and model.head.weight.shape == (64, 64)
    assert model.head.bias is None


def test_cached_extension_equals_full_forward(gpt):
    cache = gpt.init_cache(16)
    first, cache = gpt.extend(TOKENS[:4], cache)
    second, cache = gpt.extend(TOKENS[4:], cache)
    np.testing.assert_allclose(jnp.concatenate([first, second]), gpt(TOKENS), atol=1e-5)
    assert int(cache.index) == 6


def test_decoding_past_the_cache_raises(gpt):
    cache = gpt.init_cache(4)
    with pytest.raises(Exception, match="decoding past the end"):
        gpt.extend(TOKENS, cache)


def test_dropout_only_with_key(key):
    model = zoo.create("gpt-tiny", dropout=0.3, key=key)
    np.testing.assert_array_equal(model(TOKENS), model(TOKENS))
    assert not np.allclose(model(TOKENS), model(TOKENS, key=jax.random.key(1)))


def test_bfloat16_parameters_run_under_strict_promotion(key):
    model = zoo.create("gpt-tiny", dtype="bfloat16", key=key)
    logits = model(TOKENS)
    assert logits.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(logits)))


def test_wrong_rank_names_the_axes(gpt):
    batch = jnp.stack([TOKENS, TOKENS])
    # the library's own check (what a user sees without the jaxtyping import hook)
    with pytest.raises(ValueError, match=r"Int\[Array, 'seq'\].*jax.vmap"):
        check_tokens(batch, vocab_size=64, max_positions=128)
    # with the hook on (as in these tests), the annotation check fires first, naming `seq`
    with pytest.raises(Exception, match="seq"):
        gpt(batch)


def test_token_outside_vocab_raises_also_under_jit_and_vmap(gpt):
    with pytest.raises(Exception, match=r"outside \[0, 64\)"):
        gpt(TOKENS.at[0].set(64))
    with pytest.raises(Exception, match=r"outside \[0, 64\)"):
        batch = jnp.stack([TOKENS, TOKENS.at[2].set(-1)])
        jax.block_until_ready(eqx.filter_jit(lambda m, t: jax.vmap(m)(t))(gpt, batch))


def test_sequence_longer_than_max_positions_names_the_limit(gpt):
    with pytest.raises(ValueError, match="max_positions=128"):
        gpt(jnp.ones(129, jnp.int32))


def test_float_tokens_rejected(gpt):
    with pytest.raises((TypeError, Exception), match="integer|Int"):
        gpt(jnp.ones(4, jnp.float32))


def test_a_python_list_is_refused_with_the_fix():
    # without the jaxtyping hook a list reached `.ndim` and failed with an AttributeError
    with pytest.raises(TypeError, match=r"tokens must be a JAX array of token ids, got a list; "
                       r"wrap it: jnp.asarray\(tokens\)"):  # fmt: skip
        inspect.unwrap(check_tokens)([1, 2, 3], vocab_size=64, max_positions=128)


def test_the_fused_kernel_gets_the_mask_as_flags_and_lengths(monkeypatch, key):
    """The causal order goes to the kernel as `is_causal` (cuDNN's causal kernel skips the
    masked half) and padding as a key length, with no `[seq, kv_seq]` array; only a cache
    whose fill is known at run time, fed several tokens at once, needs the array."""
    seen = []
    original = jax.nn.dot_product_attention

    def recording(*args, **kwargs):
        lengths = kwargs.get("key_value_seq_lengths") is not None
        seen.append((kwargs.get("is_causal"), kwargs.get("mask") is None, lengths))
        return original(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    tokens = jnp.array([5, 9, 17, 3, 44, 8])
    for name in ("gpt-tiny", "llama-tiny"):
        xla = {"attention.implementation": "xla"}
        plain = zoo.create(name, pad_id=None, key=key, **xla)
        padded = zoo.create(name, key=key, **xla)  # pad_id 0
        seen.clear()
        causal_logits = plain(tokens)
        assert seen and set(seen) == {(True, True, False)}  # per layer (once, scanned)
        seen.clear()
        masked_logits = padded(tokens)  # no pad token in `tokens`: the same logits
        assert seen and set(seen) == {(True, True, True)}
        np.testing.assert_allclose(causal_logits, masked_logits, atol=1e-6)
        seen.clear()
        left = plain(tokens, mask=jnp.array([False] + [True] * 5))  # a left pad: 5 real keys
        assert set(seen) == {(True, True, True)}
        np.testing.assert_allclose(left[1:], plain(tokens[1:]), atol=1e-6)
        seen.clear()
        _, cache = plain.prefill(tokens[:3], 8)  # an empty cache: the new keys, in order
        assert set(seen) == {(True, True, False)}
        seen.clear()
        _, cache = plain.extend(tokens[3:4], cache)  # one query: the filled 4 keys of 8
        assert set(seen) == {(False, True, True)}
        seen.clear()
        plain.extend(tokens[4:6], cache)  # two queries at a run-time offset: the array
        assert set(seen) == {(False, False, False)}
