"""Attention maps of every flavor (shapes, rows summing to 1 over visible keys) and plots."""

import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.inspection import attention_maps, plot_attention, plot_confusion_matrix

PAD = 0
TOKENS = jnp.array([[5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD]], jnp.int32)


def visible_keys(tokens, causal):
    """[seq, seq] True where a query may see a key: not padding (and not in the future)."""
    seq = tokens.shape[0]
    visible = np.broadcast_to(np.asarray(tokens) != PAD, (seq, seq))
    return visible & np.tri(seq, dtype=bool) if causal else visible


def check_rows(maps, visible):
    """Every row sums to 1 over the keys it may see and puts exactly 0 elsewhere."""
    maps = np.asarray(maps)
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(maps[..., ~visible] == 0.0)


@pytest.fixture(scope="module")
def gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(0))


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_maps(gpt, causal):
    model = gpt if causal else zoo.create("classifier-tiny", key=jax.random.key(0))
    batch_maps = attention_maps(model, TOKENS)
    assert batch_maps.shape == (2, 2, 4, 5, 5)  # batch, layers, heads, queries, keys
    for row in range(2):
        check_rows(batch_maps[row], visible_keys(TOKENS[row], causal))
    single = attention_maps(model, TOKENS[1])
    assert single.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(single, batch_maps[1], atol=1e-6)


def test_translator_maps():
    model = zoo.create("translator-tiny", key=jax.random.key(0))
    src = TOKENS[1]  # 3 real tokens, 2 pads
    tgt = jnp.array([1, 20, 21, 22], jnp.int32)
    maps = attention_maps(model, src, tgt)
    assert maps["encoder"].shape == (2, 4, 5, 5)
    assert maps["decoder"].shape == (2, 4, 4, 4)
    assert maps["cross"].shape == (2, 4, 4, 5)
    check_rows(maps["decoder"], np.tri(4, dtype=bool))
    check_rows(maps["cross"], np.broadcast_to(np.asarray(src) != PAD, (4, 5)))
    # pad queries of the encoder still attend only to real keys
    check_rows(maps["encoder"], visible_keys(src, causal=False))
    batched = attention_maps(model, TOKENS, jnp.stack([tgt, tgt]))
    assert batched["cross"].shape == (2, 2, 4, 4, 5)


def test_attention_maps_rejects_mixed_ranks_and_other_objects(gpt):
    with pytest.raises(ValueError, match="batch"):
        attention_maps(gpt, TOKENS, TOKENS[0] != PAD)
    with pytest.raises(TypeError, match="zoo model"):
        attention_maps(eqx.nn.Identity(), TOKENS)


def test_plot_attention_draws_one_panel_per_head(tmp_path):
    weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(6, 4))  # 6 heads, 4 x 5
    path = tmp_path / "maps" / "layer0.png"
    figure = plot_attention(weights, list("abcd"), list("vwxyz"), path, columns=4)
    assert path.is_file() and path.stat().st_size > 0
    heads = [axes for axes in figure.axes if axes.images]
    assert len(heads) == 6  # a 2 x 4 grid holds 6 heads: the two spare panels are removed
    assert [axes.get_title() for axes in heads] == [f"head {h}" for h in range(6)]
    assert [t.get_text() for t in heads[0].get_xticklabels()] == list("vwxyz")
    np.testing.assert_allclose(heads[5].images[0].get_array(), weights[5])
    single = plot_attention(weights[0], list("abcd"), list("vwxyz"), tmp_path / "one.png")
    assert len([axes for axes in single.axes if axes.images]) == 1


def test_plot_attention_checks_labels(tmp_path):
    with pytest.raises(ValueError, match="labels"):
        plot_attention(np.ones((2, 3, 3)) / 3, list("ab"), list("abc"), tmp_path / "x.png")


def test_plot_confusion_matrix_annotates_every_cell(tmp_path):
    matrix = np.array([[5, 1, 0], [2, 7, 1], [0, 0, 9]])
    path = tmp_path / "confusion.png"
    figure = plot_confusion_matrix(matrix, ["neg", "neu", "pos"], path)
    assert path.is_file()
    axes = figure.axes[0]
    assert sorted(t.get_text() for t in axes.texts) == sorted(str(v) for v in matrix.ravel())
    assert axes.get_xlabel() == "predicted" and axes.get_ylabel() == "true"
    normalized = plot_confusion_matrix(matrix, ["a", "b", "c"], tmp_path / "n.png", normalize=True)
    assert normalized.axes[0].texts[0].get_text() == f"{5 / 6:.2f}"


def test_plots_without_matplotlib_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[plot\]'"):
        plot_confusion_matrix(np.eye(2), ["a", "b"], tmp_path / "c.png")
