import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import Init
from zoo.nn.moe import (
    MoEFeedForward,
    MoESettings,
    RouterStats,
    expert_load,
    grouped_matmul,
    router_losses,
)

D_MODEL, EXPERTS, WIDTH = 8, 4, 12


def make(key, **fields) -> MoEFeedForward:
    settings = MoESettings(num_experts=EXPERTS, top_k=2, d_ff=WIDTH, **fields)
    return MoEFeedForward(D_MODEL, settings, init=Init(std=0.5), key=key)


def numpy_moe(moe: MoEFeedForward, x: np.ndarray, *, renormalise: bool) -> np.ndarray:
    """Token by token: softmax router, top-2, each chosen expert's SwiGLU, weighted sum."""
    logits = x @ np.asarray(moe.router.weight).T
    probability = np.exp(logits - logits.max(-1, keepdims=True))
    probability /= probability.sum(-1, keepdims=True)
    gate, up, down = (np.asarray(a) for a in (moe.experts.gate, moe.experts.up, moe.experts.down))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        chosen = np.argsort(-probability[t])[:2]
        weights = probability[t, chosen]
        if renormalise:
            weights = weights / weights.sum()
        for e, w in zip(chosen, weights, strict=True):
            g = x[t] @ gate[e]
            hidden = g / (1 + np.exp(-g)) * (x[t] @ up[e])
            out[t] += w * (hidden @ down[e])
    return out


@pytest.mark.parametrize("renormalise", [True, False])
def test_moe_matches_a_token_by_token_numpy_loop(key, renormalise):
    moe = make(key, normalize_top_k=renormalise)
    x = np.asarray(jax.random.normal(jax.random.fold_in(key, 1), (9, D_MODEL)))
    out, _ = moe(jnp.asarray(x))
    np.testing.assert_allclose(out, numpy_moe(moe, x, renormalise=renormalise), atol=1e-4)


def test_grouped_path_equals_dense_reference_under_vmap_with_gradients(key):
    moe = make(key, shared_d_ff=6)
    x = jax.random.normal(jax.random.fold_in(key, 1), (3, 7, D_MODEL))

    def loss(model):
        out, stats = jax.vmap(model)(x)
        balance, z = router_losses(stats)
        return jnp.sum(out**2) + balance + z

    ragged_loss, ragged_grads = eqx.filter_value_and_grad(loss)(moe)
    dense = make(key, shared_d_ff=6, implementation="dense")
    dense_loss, dense_grads = eqx.filter_value_and_grad(loss)(dense)
    np.testing.assert_allclose(ragged_loss, dense_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ragged_grads), jax.tree.leaves(dense_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_grouped_matmul_under_vmap_equals_each_example_alone(key):
    weights = jax.random.normal(key, (EXPERTS, 5, 3))
    rows = jax.random.normal(jax.random.fold_in(key, 1), (3, 10, 5))
    sizes = jnp.array([[3, 3, 2, 2], [10, 0, 0, 0], [0, 1, 0, 9]], jnp.int32)
    batched = jax.jit(jax.vmap(grouped_matmul, in_axes=(0, None, 0)))(rows, weights, sizes)
    for b in range(3):
        ends = np.cumsum(sizes[b])
        expert = np.searchsorted(ends, np.arange(10), side="right")
        expected = np.einsum("rd,rdo->ro", rows[b], np.asarray(weights)[expert])
        np.testing.assert_allclose(batched[b], expected, rtol=1e-5, atol=1e-5)


def test_router_renormalises_top_k_or_not(key):
    moe = make(key)
    x = jax.random.normal(key, (5, D_MODEL))
    _, weights, chosen = moe.route(x)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    plain = make(key, normalize_top_k=False)
    logits, raw, same = plain.route(x)
    np.testing.assert_array_equal(chosen, same)
    expected = np.take_along_axis(np.asarray(jax.nn.softmax(logits)), np.asarray(chosen), 1)
    np.testing.assert_allclose(raw, expected, rtol=1e-6)


def test_sigmoid_router_chooses_with_its_bias_and_weighs_without(key):
    moe = make(key, router="sigmoid", normalize_top_k=False)
    x = jax.random.normal(key, (6, D_MODEL))
    biased = eqx.tree_at(lambda m: m.selection_bias, moe, jnp.array([0.0, 0.0, 0.0, 10.0]))
    logits, weights, chosen = biased.route(x)
    assert bool(jnp.all(jnp.any(chosen == 3, axis=-1)))  # the bias puts expert 3 in every top-2
    sigmoid = np.asarray(jax.nn.sigmoid(logits))
    np.testing.assert_allclose(weights, np.take_along_axis(sigmoid, np.asarray(chosen), 1))


def test_load_balancing_loss_is_the_mixtral_formula(key):
    """Hand numbers: 2 experts, 2 tokens, top-1; the router sends both tokens to expert 0."""
    probability = np.array([[0.75, 0.25], [0.5, 0.5]])
    logits = np.log(probability)
    stats = RouterStats(
        expert_tokens=jnp.array([2.0, 0.0]),
        expert_probability=jnp.asarray(probability.sum(0), jnp.float32),
        tokens=jnp.array(2.0),
        z_sum=jnp.asarray(np.sum(np.log(np.exp(logits).sum(-1)) ** 2), jnp.float32),
    )
    balance, z = router_losses(stats)
    # 2 * (1.0 * 0.625 + 0.0 * 0.375)
    np.testing.assert_allclose(balance, 1.25, rtol=1e-6)
    np.testing.assert_allclose(z, 0.0, atol=1e-6)  # probabilities: logsumexp = 0
    np.testing.assert_allclose(expert_load(stats), 2.0)  # 2 tokens against a mean of 1


def test_statistics_skip_invalid_tokens_and_count_top_k_slots(key):
    moe = make(key)
    x = jax.random.normal(key, (6, D_MODEL))
    _, stats = moe(x, valid=jnp.arange(6) < 4)
    _, first_four = moe(x[:4])
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(first_four), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(stats.expert_tokens.sum(), 4 * 2)


def test_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="top_k=3 exceeds num_experts=2"):
        MoESettings(num_experts=2, top_k=3, d_ff=4)
    with pytest.raises(ValueError, match="router must be one of"):
        MoESettings(num_experts=2, d_ff=4, router="relu")
    with pytest.raises(ValueError, match="d_ff must be a positive integer"):
        MoESettings(num_experts=2, d_ff=0)
