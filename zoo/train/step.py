"""The jitted train and eval steps: forward, loss, gradient (accumulated), optax update.

One `eqx.filter_jit` function does a whole optimiser step. The model and optimizer state are
donated (their buffers are reused for the results), the batch axis comes first and nothing in
the step refers to devices, so sharded inputs work unchanged.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from contextlib import AbstractContextManager
from typing import TypeVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from zoo.distributed.layout import Layout
from zoo.nn.embedding import ids_checked_on_host
from zoo.tasks.base import Stats, Task
from zoo.train.optim import OptimizerLike

# one batch: arrays with the batch axis first, by name ("tokens", "labels", ...)
Batch = Mapping[str, ArrayLike]
# `evaluate(model, batch) -> Stats` (`make_eval_step`)
EvalStep = Callable[[eqx.Module, Batch], Stats]

# precision option -> the dtype forward and backward run in (master weights stay float32)
PRECISIONS = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


class StepOutput(eqx.Module):
    """What a train step reports: summed statistics and the gradient's global norm."""

    stats: Stats
    grad_norm: Float[Array, ""]


PRECISION_CHOICES = ("auto", *PRECISIONS)


def check_precision(precision: str) -> jax.typing.DTypeLike:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def resolve_precision(precision: str) -> str:
    """`precision` itself, or for "auto" the fastest one here: bf16 compute (float32 master
    weights) on a GPU or TPU, where it runs the fused attention kernels and halves the bytes
    moved, and fp32 on a CPU, which has no faster bf16 matmul."""
    if precision == "auto":
        return "fp32" if jax.default_backend() == "cpu" else "bf16"
    check_precision(precision)
    return precision


def cast_floating(tree: PyTree, dtype: jax.typing.DTypeLike) -> PyTree:
    """`tree` with every floating-point array cast to `dtype` (integers and the rest untouched)."""

    def cast(leaf):
        if eqx.is_inexact_array(leaf) and leaf.dtype != dtype:
            return leaf.astype(dtype)
        return leaf

    return jax.tree_util.tree_map(cast, tree)


def promotion_scope(precision: str) -> AbstractContextManager[object]:
    """Where the step runs: bf16 compute needs JAX's standard dtype promotion.

    `jax.nn.dot_product_attention` promotes bfloat16 queries with float32 internally, which
    fails when a program sets `jax_numpy_dtype_promotion="strict"` (as the test-suite does).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    return jax.numpy_dtype_promotion("standard")


def _split_micro_batches(batch: Mapping[str, ArrayLike], accumulate: int) -> dict[str, Array]:
    """`[batch, ...]` -> `[accumulate, batch // accumulate, ...]` (consecutive rows together)."""
    return {
        name: jnp.reshape(value, (accumulate, -1, *jnp.shape(value)[1:]))
        for name, value in batch.items()
    }


def split_trained(optimizer: OptimizerLike, params: PyTree) -> tuple[PyTree, PyTree]:
    """`(trained, frozen)` halves of `params` by the optimizer's `labels` ("train"/"frozen").

    Without labels every array is trained. Differentiating the trained half only saves the
    frozen weights' gradients: LoRA on a large base computes no full-size weight gradient.
    """
    labels = getattr(optimizer, "labels", None)
    if labels is None:
        return params, jax.tree_util.tree_map(lambda _: None, params)
    trained_mask = jax.tree_util.tree_map(lambda label: label == "train", labels(params))
    return eqx.partition(params, trained_mask)


def make_train_step(
    task: Task,
    optimizer: OptimizerLike,
    *,
    accumulate: int = 1,
    precision: str = "fp32",
    layout: Layout | None = None,
    host_checks: bool = False,
) -> TrainStep:
    """`step(model, opt_state, batch, key, step) -> (model, opt_state, StepOutput)`.

    The dropout key of step `s` is `fold_in(key, s)`, so a resumed run draws the same keys.
    With `accumulate=k` the batch is cut into k micro-batches run one after another with
    `lax.scan`; their summed statistics and gradients equal those of the whole batch.
    With a `layout` (`zoo.distributed.Layout`) the batch is placed split by rows over the mesh
    and the updated model and optimizer state keep the shardings of its rules.
    With `host_checks=True` each call checks its batch on the host (`Task.check_batch`: token
    ids against the vocabulary, shapes) instead of inside the compiled program: the program
    then has no host callback, which JAX's persistent compilation cache cannot keep
    (`zoo.train.compile_cache`).
    """
    compute_dtype = check_precision(precision)

    def objective(params, static, batch, key):
        # `static` holds the non-float leaves and the frozen arrays: no gradient is taken there
        model = cast_floating(eqx.combine(params, static), compute_dtype)
        stats = task.statistics(model, batch, key=key)
        return stats.loss_sum, stats

    summed_gradient = jax.grad(objective, has_aux=True)

    def gradients(params, static, batch, key):
        if accumulate == 1:
            return summed_gradient(params, static, batch, key)

        def body(carry, micro):
            grads, stats = carry
            micro_batch, micro_key = micro
            micro_grads, micro_stats = summed_gradient(params, static, micro_batch, micro_key)
            return (jax.tree_util.tree_map(jnp.add, grads, micro_grads), stats + micro_stats), None

        zero_grads = jax.tree_util.tree_map(jnp.zeros_like, params)
        micro = (_split_micro_batches(batch, accumulate), jax.random.split(key, accumulate))
        # zeros shaped like a micro-batch's statistics (a task may add named sums)
        first = jax.tree_util.tree_map(lambda value: value[0], micro)
        shapes = jax.eval_shape(lambda p, m: summed_gradient(p, static, *m)[1], params, first)
        zero_stats = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (grads, stats), _ = jax.lax.scan(body, (zero_grads, zero_stats), micro)
        return grads, stats

    @eqx.filter_jit(donate="all-except-first")
    def train_step(inputs, model, opt_state, checked_on_host: bool):
        batch, base_key, step_index = inputs
        params, static = eqx.partition(model, eqx.is_inexact_array)
        trained, frozen = split_trained(optimizer, params)
        fixed = eqx.combine(frozen, static)
        with ids_checked_on_host(checked_on_host):
            grads, stats = gradients(
                trained, fixed, batch, jax.random.fold_in(base_key, step_index)
            )
        # The loss is loss_sum / weight and the weight does not depend on the parameters.
        scale = 1.0 / jnp.maximum(stats.weight, 1.0)
        grads = jax.tree_util.tree_map(lambda g: g * scale.astype(g.dtype), grads)
        grad_norm = optax.tree.norm(grads)
        # frozen arrays get zero gradients, which the optimizer discards (`set_to_zero`)
        grads = eqx.combine(grads, jax.tree_util.tree_map(jnp.zeros_like, frozen))
        # Optax mixes Python floats with integer step counts (`b1 ** count`).
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        model = eqx.combine(params, static)
        if layout is not None:  # each array keeps its sharding from step to step
            model, opt_state = layout.constrain(model), layout.constrain(opt_state)
        return model, opt_state, StepOutput(stats, grad_norm)

    checks = task if host_checks else None
    return TrainStep(train_step, precision=precision, layout=layout, checks=checks)


def _concrete(batch: Batch) -> bool:
    """Whether every array of `batch` has values (none is a tracer of an outer transformation)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(batch))


class TrainStep:
    """A compiled train step: `step(model, opt_state, batch, key, step_number)` returns
    `(model, opt_state, StepOutput)`, donating the model's and optimizer state's buffers."""

    def __init__(
        self, jitted: Callable, *, precision: str, layout: Layout | None, checks: Task | None = None
    ):
        self._jitted = jitted  # (inputs, model, opt_state) -> (model, opt_state, StepOutput)
        self.precision = precision
        self.layout = layout
        self.checks = checks  # the task that checks each batch on the host (None: on device)

    def _inputs(self, batch: Batch, key: PRNGKeyArray, step: int) -> tuple:
        step_index: Int[Array, ""] = jnp.asarray(step, jnp.int32)
        if self.layout is not None:
            batch = self.layout.place_batch(batch)
        return dict(batch), key, step_index

    def __call__(
        self,
        model: eqx.Module,
        opt_state: PyTree,
        batch: Batch,
        key: PRNGKeyArray,
        step: int,
        *,
        checked: bool = False,
    ) -> tuple[eqx.Module, PyTree, StepOutput]:
        """One step. `checked=True`: the caller has checked this batch with the task's
        `check_batch` already (a batch used again and again, as `zoo bench` does), so it is not
        read back to the host again."""
        # a batch traced by an outer transformation has no values to check on the host: the
        # step then checks its ids on the device
        on_host = self.checks is not None and (checked or _concrete(batch))
        if on_host and not checked:
            self.checks.check_batch(batch, model)  # type: ignore[union-attr]
        with promotion_scope(self.precision):
            return self._jitted(self._inputs(batch, key, step), model, opt_state, on_host)

    def lower(
        self, model: eqx.Module, opt_state: PyTree, batch: Batch, key: PRNGKeyArray, step: int = 0
    ) -> eqx.Module:
        """The step lowered for these arguments: equinox's `Lowered` (`.as_text()`,
        `.compile().compiled.memory_analysis()`)."""
        with promotion_scope(self.precision):
            inputs = self._inputs(batch, key, step)
            on_host = self.checks is not None  # the program `__call__` runs on a concrete batch
            return self._jitted.lower(inputs, model, opt_state, on_host)  # type: ignore[attr-defined]


def make_eval_step(
    task: Task, *, precision: str = "fp32", layout: Layout | None = None, host_checks: bool = False
) -> EvalStep:
    """`evaluate(model, batch) -> Stats`: deterministic (no dropout), in the compute dtype.

    With a `layout` the batch is placed split by rows over its mesh. `host_checks` as in
    `make_train_step`."""
    compute_dtype = check_precision(precision)

    @eqx.filter_jit
    def eval_step(model, batch, checked_on_host: bool):
        with ids_checked_on_host(checked_on_host):
            return task.statistics(cast_floating(model, compute_dtype), batch, key=None)

    def run(model: eqx.Module, batch: Batch) -> Stats:
        on_host = host_checks and _concrete(batch)  # as in `TrainStep.__call__`
        if on_host:
            task.check_batch(batch, model)
        if layout is not None:  # a last, smaller batch may not split: it goes whole
            batch = layout.place_batch(batch, even=False)
        with promotion_scope(precision):
            return eval_step(model, dict(batch), on_host)

    return run


# Compiled steps are reused by every Trainer with interchangeable settings (a new Trainer in a
# notebook, `zoo train --resume` run in-process), so XLA does not compile the same step twice.
Step = TypeVar("Step", TrainStep, EvalStep)
_SHARED: OrderedDict[Hashable, tuple[TrainStep | EvalStep, tuple]] = OrderedDict()
_SHARED_SIZE = 16


def _identity(obj: object) -> Hashable:
    """Equal for interchangeable objects: recorded settings or hashable attributes, else `id`."""
    settings = getattr(obj, "settings", None)  # zoo.train.adamw records its arguments
    if settings:
        return (type(obj).__qualname__, settings)
    try:
        state = (type(obj), tuple(sorted(vars(obj).items())))
        hash(state)
    except TypeError:
        return ("object", id(obj))
    return state


def _shared(key: Hashable, build: Callable[[], Step], keep_alive: tuple) -> Step:
    if key not in _SHARED:
        # `keep_alive` holds the objects whose ids may be in `key`, so no new object reuses one.
        _SHARED[key] = (build(), keep_alive)
        while len(_SHARED) > _SHARED_SIZE:
            _SHARED.popitem(last=False)
    _SHARED.move_to_end(key)
    return cast(Step, _SHARED[key][0])


def shared_train_step(
    task: Task,
    optimizer: OptimizerLike,
    *,
    accumulate: int,
    precision: str,
    layout: Layout | None = None,
    host_checks: bool = False,
) -> TrainStep:
    """`make_train_step`, reused across calls with interchangeable task and optimizer."""
    settings = (accumulate, precision, layout, host_checks)
    key = ("train", _identity(task), _identity(optimizer), *settings)

    def build() -> TrainStep:
        return make_train_step(
            task,
            optimizer,
            accumulate=accumulate,
            precision=precision,
            layout=layout,
            host_checks=host_checks,
        )

    return _shared(key, build, (task, optimizer))


def shared_eval_step(
    task: Task, *, precision: str, layout: Layout | None = None, host_checks: bool = False
) -> EvalStep:
    """`make_eval_step`, reused across calls with an interchangeable task."""
    key = ("eval", _identity(task), precision, layout, host_checks)

    def build() -> EvalStep:
        return make_eval_step(task, precision=precision, layout=layout, host_checks=host_checks)

    return _shared(key, build, (task,))
