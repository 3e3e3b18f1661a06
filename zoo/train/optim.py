"""Optimisers and learning-rate schedules: AdamW with a decay mask, clipping, warmup.

`adamw(lr=3e-4, warmup=200)` gives global-norm clipping followed by AdamW whose weight decay
touches only the weight matrices of `Linear` layers (no decay on biases, LayerNorms and
embeddings), with linear warmup and inverse-square-root decay.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import ArrayLike, PyTree

from zoo.distributed.layout import Layout
from zoo.nn.linear import Linear

SCHEDULES = ("inverse_sqrt", "cosine", "constant")


def _updates_done(count: ArrayLike) -> jax.Array:
    """Optax counts updates from 0; schedules below are written for update number 1, 2, ..."""
    return jnp.asarray(count).astype(jnp.float32) + 1.0


def constant(lr: float, *, warmup: int = 0) -> optax.Schedule:
    """`lr`, reached linearly over the first `warmup` updates (`lr * s / warmup` at update s)."""

    def schedule(count):
        s = _updates_done(count)
        if warmup <= 0:
            return jnp.full((), lr, jnp.float32)
        return lr * jnp.minimum(s / warmup, 1.0)

    return schedule


def inverse_sqrt(lr: float, *, warmup: int) -> optax.Schedule:
    """The paper's schedule scaled to peak at `lr`: `lr * min(s / warmup, sqrt(warmup / s))`.

    "Attention is all you need" uses `d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)`, which is
    this with `lr = paper_peak_lr(d_model, warmup)`.
    """
    if warmup < 1:
        raise ValueError(f"inverse_sqrt needs warmup >= 1 (its peak), got warmup={warmup}")

    def schedule(count):
        s = _updates_done(count)
        return lr * jnp.minimum(s / warmup, jnp.sqrt(warmup / s))

    return schedule


def cosine(
    lr: float, *, warmup: int = 0, total_steps: int, final_fraction: float = 0.0
) -> optax.Schedule:
    """Linear warmup to `lr`, then a half cosine down to `final_fraction * lr` at `total_steps`."""
    if total_steps <= warmup:
        raise ValueError(
            f"cosine needs total_steps > warmup, got total_steps={total_steps}, warmup={warmup}"
        )

    def schedule(count):
        s = _updates_done(count)
        ramp = s / warmup if warmup > 0 else jnp.ones((), jnp.float32)
        progress = jnp.clip((s - warmup) / (total_steps - warmup), 0.0, 1.0)
        decay = final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return lr * jnp.where(s < warmup, ramp, decay)

    return schedule


def make_schedule(
    name: str, lr: float, *, warmup: int = 0, total_steps: int | None = None
) -> optax.Schedule:
    """The schedule called `name` (one of `SCHEDULES`)."""
    if name == "constant":
        return constant(lr, warmup=warmup)
    if name == "inverse_sqrt":
        return inverse_sqrt(lr, warmup=warmup)
    if name == "cosine":
        if total_steps is None:
            raise ValueError("the cosine schedule needs total_steps (the step it reaches its end)")
        return cosine(lr, warmup=warmup, total_steps=total_steps)
    raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")


def paper_peak_lr(d_model: int, warmup: int) -> float:
    """Peak learning rate of the paper's schedule: `(d_model * warmup) ** -0.5`."""
    return (d_model * warmup) ** -0.5


def decay_mask(params: PyTree) -> PyTree:
    """True for the arrays weight decay applies to: the weight matrices of `Linear` layers.

    Biases, LayerNorm scales and offsets, embedding tables (token, position, type) and any other
    array get False. Works on a model or on its filtered parameters (`eqx.filter`).
    """

    def mark(node):
        if isinstance(node, Linear):
            marked = jax.tree_util.tree_map(lambda _: False, node)
            return eqx.tree_at(lambda linear: linear.weight, marked, True)
        return False

    return jax.tree_util.tree_map(mark, params, is_leaf=lambda node: isinstance(node, Linear))


def _check_number(
    name: str, value: float, *, minimum: float, inclusive: bool = True, off: str = ""
) -> None:
    """`value` is a finite number above `minimum` (or equal to it when `inclusive`).

    NaN passes every `<` test and a negative clip norm or weight decay flips the update's sign,
    so each would train silently wrong.
    """
    ok = math.isfinite(value) and (value >= minimum if inclusive else value > minimum)
    if not ok:
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        hint = f" ({off})" if off else ""
        raise ValueError(f"{name} must be a finite number {bound}{hint}, got {value}")


class Optimizer(NamedTuple):
    """An optax transformation (`init`, `update`) that also knows its learning-rate schedule.

    `settings` records the arguments that built it: two optimizers with equal settings behave
    identically, so trainers can share one compiled step. `labels`, when set, marks each array
    of the parameters "train" or "frozen" (`zoo.train.freeze.train_only`): the train step then
    differentiates the trained arrays only, as the frozen ones are never updated.
    """

    init: Callable
    update: Callable
    learning_rate: optax.Schedule
    settings: tuple = ()
    labels: Callable | None = None


def adamw(
    lr: float = 3e-4,
    *,
    warmup: int = 0,
    schedule: str | None = None,
    total_steps: int | None = None,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    clip_norm: float | None = 1.0,
) -> Optimizer:
    """Global-norm clipping, then AdamW with `decay_mask` and a learning-rate schedule.

    The hyperparameters are flat keywords, as in `optax.adamw` and `torch.optim.AdamW` (one of
    the exceptions to the eight-parameter limit named in `tests/test_architecture.py`). The
    paper used `b2=0.98, eps=1e-9`.

    Args:
        lr: the peak learning rate (finite, > 0).
        warmup: updates of linear warmup to `lr`.
        schedule: "inverse_sqrt" (the default when `warmup > 0`), "cosine" (needs
            `total_steps`) or "constant" (the default without warmup).
        total_steps: where the cosine schedule ends.
        weight_decay: decoupled weight decay of the `Linear` weight matrices (finite, >= 0).
        b1: Adam's first-moment decay.
        b2: Adam's second-moment decay.
        eps: added to the root of the second moment.
        clip_norm: the global gradient norm clipped to (None: no clipping).
    """
    _check_number("lr", lr, minimum=0.0, inclusive=False)
    _check_number("weight_decay", weight_decay, minimum=0.0)
    if clip_norm is not None:
        _check_number(
            "clip_norm",
            clip_norm,
            minimum=0.0,
            inclusive=False,
            off="None, or --clip-norm 0, turns clipping off",
        )
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if schedule is None:
        schedule = "inverse_sqrt" if warmup > 0 else "constant"
    learning_rate = make_schedule(schedule, lr, warmup=warmup, total_steps=total_steps)
    adam = optax.adamw(
        learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask
    )
    parts = [adam] if clip_norm is None else [optax.clip_by_global_norm(clip_norm), adam]
    chained = optax.chain(*parts)
    settings = (
        ("adamw", lr),
        ("warmup", warmup),
        ("schedule", schedule),
        ("total_steps", total_steps if schedule == "cosine" else None),
        ("weight_decay", weight_decay),
        ("betas", b1, b2),
        ("eps", eps),
        ("clip_norm", clip_norm),
    )
    return Optimizer(chained.init, chained.update, learning_rate, settings)


# What zoo trains with: an `Optimizer`, or any optax transformation (which has no schedule to
# report and no `settings` to share compiled steps by).
OptimizerLike: TypeAlias = Optimizer | optax.GradientTransformation


def learning_rate(optimizer: OptimizerLike, step: int) -> float | None:
    """The learning rate of update number `step` (1-based), if the optimizer exposes it."""
    schedule = getattr(optimizer, "learning_rate", None)
    return None if schedule is None else float(schedule(step - 1))


def init_optimizer(
    optimizer: OptimizerLike, model: eqx.Module, layout: Layout | None = None
) -> optax.OptState:
    """The optimizer state for `model`'s floating-point arrays (sharded on `layout`'s mesh)."""
    params = eqx.filter(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        if layout is None:
            return optimizer.init(params)
        shapes = jax.eval_shape(optimizer.init, params)
        init = jax.jit(optimizer.init, out_shardings=layout.shardings(shapes))
        return init(params)
