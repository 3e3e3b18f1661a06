"""Looking inside models: attention weights per layer and head, and plots of them.

`attention_maps` works for every flavor and for one example or a batch (decided by the rank of
the first input). The plots need matplotlib (`pip install 'jax-transformer-zoo[plot]'`),
imported only when a plot is drawn; they use matplotlib's object API, so no GUI backend or
global state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from zoo.extras import pip_install
from zoo.models import GPT, Classifier, Translator

AttentionMaps = (
    Float[Array, "*batch layers heads q k"] | dict[str, Float[Array, "*batch layers heads q k"]]
)


@eqx.filter_jit
def _maps(model, inputs, batched):
    def one(*example):
        return model.attention_maps(*example)

    return jax.vmap(one)(*inputs) if batched else one(*inputs)


def attention_maps(model: eqx.Module, *inputs: ArrayLike) -> AttentionMaps:
    """Attention weights of every layer and head, without dropout.

    - `GPT` / `Classifier`: `attention_maps(model, tokens[, mask])` ->
      `[layers, heads, seq, seq]`; row `i` is how query `i` spreads over the keys.
    - `Translator`: `attention_maps(model, src, tgt)` -> dict with `encoder` `[.., src, src]`,
      `decoder` `[.., tgt, tgt]` and `cross` `[.., tgt, src]`.

    One example (`tokens` of shape `[seq]`) gives the shapes above; a batch (`[batch, seq]`)
    adds a leading `batch` axis. Padding keys (`pad_id`) get weight 0, so every row sums to 1
    over the keys it may see.
    """
    if not isinstance(model, GPT | Classifier | Translator):
        raise TypeError(f"attention_maps needs a zoo model, got {type(model).__name__}")
    allowed = (2,) if isinstance(model, Translator) else (1, 2)
    if len(inputs) not in allowed:
        usage = "(model, src, tgt)" if isinstance(model, Translator) else "(model, tokens[, mask])"
        raise TypeError(f"attention_maps{usage} got {len(inputs)} inputs")
    arrays = tuple(jnp.asarray(x) for x in inputs)
    rank = arrays[0].ndim
    if rank not in (1, 2) or any(x.ndim != rank for x in arrays):
        raise ValueError(
            "inputs must all be one example [seq] or all a batch [batch, seq], got shapes "
            f"{[tuple(x.shape) for x in arrays]}"
        )
    return _maps(model, arrays, rank == 2)


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            f"plotting needs matplotlib, which is not installed: {pip_install('plot')}"
        ) from error
    return Figure


def _save(figure, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")


def plot_attention(
    weights: Float[Array, "heads q k"] | Float[Array, "q k"] | np.ndarray,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
    columns: int = 4,
    cmap: str = "viridis",
):
    """Heatmaps of one layer's attention, one panel per head, with token labels on the axes.

    `weights` is `[heads, q, k]` (e.g. `attention_maps(model, tokens)[layer]`) or one `[q, k]`
    map. Writes the image to `path` (format from the suffix) and returns the matplotlib
    `Figure`, whose heatmap axes are one per head, in head order.

    Args:
        weights: attention weights, `[heads, q, k]` or `[q, k]`.
        query_labels: one label per query position (the rows).
        key_labels: one label per key position (the columns).
        path: the image file to write.
        title: a title over the panels.
        columns: panels per row.
        cmap: the matplotlib colour map.
    """
    maps = np.asarray(weights, dtype=np.float32)
    if maps.ndim == 2:
        maps = maps[None]
    if maps.ndim != 3:
        raise ValueError(f"weights must be [heads, q, k] or [q, k], got shape {maps.shape}")
    num_heads, num_queries, num_keys = maps.shape
    if len(query_labels) != num_queries or len(key_labels) != num_keys:
        raise ValueError(
            f"weights are {num_queries} queries x {num_keys} keys but got "
            f"{len(query_labels)} query labels and {len(key_labels)} key labels"
        )
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    columns = min(columns, num_heads)
    rows = math.ceil(num_heads / columns)
    panel = 0.35 * max(num_queries, num_keys) + 1.5
    figure = _figure_class()(figsize=(panel * columns + 1.0, panel * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    image = None
    for head, axes in enumerate(grid.flat):
        if head >= num_heads:
            axes.remove()
            continue
        image = axes.imshow(maps[head], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        axes.set_title(f"head {head}")
        axes.set_xticks(range(num_keys), labels=list(key_labels), rotation=90)
        axes.set_yticks(range(num_queries), labels=list(query_labels))
        axes.set_xlabel("key")
        axes.set_ylabel("query")
    figure.colorbar(image, ax=grid.ravel()[:num_heads].tolist(), label="attention weight")
    if title:
        figure.suptitle(title)
    _save(figure, path)
    return figure


def plot_confusion_matrix(
    matrix: Float[Array, "classes classes"] | np.ndarray,
    labels: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
    normalize: bool = False,
    cmap: str = "Blues",
):
    """Heatmap of a confusion matrix (rows: true class, columns: predicted), cells annotated.

    With `normalize=True` each row is divided by its total (recall per class). Writes the image
    to `path` and returns the matplotlib `Figure`.
    """
    counts = np.asarray(matrix, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"matrix must be square [classes, classes], got shape {counts.shape}")
    if len(labels) != counts.shape[0]:
        raise ValueError(f"{counts.shape[0]} classes but {len(labels)} labels")
    if normalize:
        counts = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1e-12)
    size = 0.6 * len(labels) + 2.0
    figure = _figure_class()(figsize=(size + 1.0, size), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(counts, cmap=cmap)
    ticks = range(len(labels))
    axes.set_xticks(ticks, labels=list(labels), rotation=45, ha="right")
    axes.set_yticks(ticks, labels=list(labels))
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    middle = (counts.max() + counts.min()) / 2.0
    for (row, column), value in np.ndenumerate(counts):
        text = f"{value:.2f}" if normalize else f"{value:g}"
        color = "white" if value > middle else "black"
        axes.text(column, row, text, ha="center", va="center", color=color)
    figure.colorbar(image, ax=axes)
    if title:
        axes.set_title(title)
    _save(figure, path)
    return figure
