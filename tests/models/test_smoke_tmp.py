import jax
import jax.numpy as jnp

import zoo


def test_all_tiny(key):
    t = jnp.array([5, 6, 7, 8, 0, 0])
    g = zoo.create("gpt-tiny", key=key)
    assert jax.vmap(g)(jnp.stack([t, t])).shape == (2, 6, 64)
    c = g.init_cache(16)
    logits, c = g.extend(t[:3], c)
    assert jnp.allclose(logits, g(t)[:3], atol=1e-5)
    clf = zoo.create("classifier-tiny", key=key)
    assert clf(t).shape == (2,)
    clf(t, key=key)
    tr = zoo.create("translator-tiny", key=key)
    assert tr(t, t, key=key).shape == (6, 64)
    st = tr.start_decoding(t, 8)
    a, st = tr.decode_step(jnp.array([1, 5]), st)
    assert jnp.allclose(a, tr(t, jnp.array([1, 5])), atol=1e-5)
    tr.attention_maps(t, t)
    g.attention_maps(t)
