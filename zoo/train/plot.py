"""Training curves as a PNG (matplotlib is optional: `pip install 'jax-transformer-zoo[plot]'`)."""

from __future__ import annotations

import os
from pathlib import Path

from zoo.extras import pip_install
from zoo.train.history import History


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            f"plotting training curves needs matplotlib: {pip_install('plot')}"
        ) from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def check_matplotlib() -> None:
    """Raise the ImportError that says how to install matplotlib (for a run that will plot)."""
    _pyplot()


def plot_history(history: History, path: str | os.PathLike) -> Path:
    """Loss and metric against step, train and eval, side by side; returns the file written."""
    plt = _pyplot()
    figure, (loss_axis, metric_axis) = plt.subplots(1, 2, figsize=(10, 4))
    metric_name = "metric"
    for split, style in (("train", "-"), ("eval", "o-")):
        rows = [r for r in history.split(split) if isinstance(r["loss"], float)]
        if not rows:
            continue
        steps = [r["step"] for r in rows]
        loss_axis.plot(steps, [r["loss"] for r in rows], style, label=split)
        metric_axis.plot(steps, [r["metric"] for r in rows], style, label=split)
        metric_name = rows[-1]["metric_name"]
    loss_axis.set(xlabel="step", ylabel="loss", title="loss")
    metric_axis.set(xlabel="step", ylabel=metric_name, title=metric_name)
    for axis in (loss_axis, metric_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
