"""What every task shares: summed statistics, fp32 cross-entropy, and host-side batch checks.

A task turns a batch (a dict of `int32[batch, ...]` arrays, see `zoo.data.batches`) and a
per-example model into *summed* statistics. Sums, not means, so that statistics of several
micro-batches (gradient accumulation) or eval batches add up to those of one big batch; the
loss is `loss_sum / weight` only at the end.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from zoo.models.classifier import Classifier, ClassifierConfig
from zoo.models.common import Routed
from zoo.models.config import TransformerConfig
from zoo.models.gpt import GPT
from zoo.models.translator import Translator, TranslatorConfig
from zoo.nn.vocab import VocabHead


@runtime_checkable
class TaskModel(Protocol):
    """What every task reads of a model: its config (vocabulary, lengths, padding, and the
    router loss weights of a mixture of experts) and one call that returns its output with the
    routers' statistics (`zoo.models.Routed`), so that every task adds the router losses of a
    mixture of experts (`zoo.tasks.router_losses`). Each flavor's protocol below names that
    call; the flavor's class (`zoo.GPT`, `zoo.Classifier`, `zoo.Translator`) has it, and so may
    a model of one's own."""

    @property
    def config(self) -> TransformerConfig: ...


@runtime_checkable
class CausalModel(TaskModel, Protocol):
    """A GPT as `LanguageModeling` and `Preference` read it: the features of every position
    with the routers' statistics, and the head that turns features into vocabulary logits."""

    @property
    def output_head(self) -> VocabHead: ...

    def features_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        *,
        segments: Int[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Routed: ...


@runtime_checkable
class SequenceClassifier(TaskModel, Protocol):
    """A classifier as `Classification` reads it: class logits with the routers' statistics."""

    @property
    def config(self) -> ClassifierConfig: ...

    def logits_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        token_types: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed: ...


@runtime_checkable
class SequenceToSequence(TaskModel, Protocol):
    """A translator as `Translation` reads it: the decoder's features of every target position
    with the routers' statistics, and the head onto the target vocabulary."""

    @property
    def config(self) -> TranslatorConfig: ...

    @property
    def output_head(self) -> VocabHead: ...

    def features_and_router(
        self,
        src: Int[Array, " src"],
        tgt: Int[Array, " tgt"],
        src_mask: Bool[Array, " src"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed: ...


# a task's model: the flavor's class, or any model with the calls of the flavor's protocol (the
# class comes first, so that a model of it, abstract ones too, is told by its class alone)
LanguageModel = GPT | CausalModel
Classifies = Classifier | SequenceClassifier
Translates = Translator | SequenceToSequence
ModelT = TypeVar("ModelT", bound=TaskModel)


class Stats(eqx.Module):
    """Sums over the scored positions (tokens, or examples for classification) of a batch."""

    loss_sum: Float[Array, ""]  # the training objective (label-smoothed where enabled)
    nll_sum: Float[Array, ""]  # plain negative log-likelihood of the references
    weight: Float[Array, ""]  # number of scored positions (padding excluded)
    correct: Float[Array, ""]  # scored positions whose argmax equals the reference
    # more sums a task reports by name (`Task.metrics` divides them by `weight`)
    extra: dict[str, Float[Array, ""]] = eqx.field(default_factory=dict)

    @staticmethod
    def zero() -> Stats:
        zero = jnp.zeros((), jnp.float32)
        return Stats(zero, zero, zero, zero)

    def __add__(self, other: Stats) -> Stats:
        if self.extra.keys() == other.extra.keys():
            return jax.tree_util.tree_map(jnp.add, self, other)
        # `Stats.zero()` (no named sums) plus a task's statistics: a missing sum counts as 0
        zero = jnp.zeros((), jnp.float32)
        extra = {
            name: jnp.add(self.extra.get(name, zero), other.extra.get(name, zero))
            for name in sorted(self.extra.keys() | other.extra.keys())
        }
        return Stats(
            jnp.add(self.loss_sum, other.loss_sum),
            jnp.add(self.nll_sum, other.nll_sum),
            jnp.add(self.weight, other.weight),
            jnp.add(self.correct, other.correct),
            extra,
        )

    @property
    def loss(self) -> Float[Array, ""]:
        """Mean objective per scored position (0 when nothing is scored)."""
        return self.loss_sum / jnp.maximum(self.weight, 1.0)

    @property
    def accuracy(self) -> Float[Array, ""]:
        return self.correct / jnp.maximum(self.weight, 1.0)

    @property
    def perplexity(self) -> Float[Array, ""]:
        return jnp.exp(self.nll_sum / jnp.maximum(self.weight, 1.0))


def token_losses(
    logits: Float[Array, "*positions vocab"],
    targets: Int[Array, "*positions"],
    label_smoothing: float = 0.0,
    *,
    vocab_size: int | None = None,
) -> tuple[Float[Array, "*positions"], Float[Array, "*positions"], Bool[Array, "*positions"]]:
    """Per-position (objective, negative log-likelihood, argmax is right), computed in float32.

    `vocab_size` smaller than the logits' last axis: the columns from `vocab_size` on are
    padding (`zoo.nn.VocabHead`), masked out of everything below.

    With label smoothing `eps` the reference distribution is `(1 - eps) * one_hot + eps / vocab`,
    so the objective is `(1 - eps) * nll + eps * mean(-log_softmax)` over the vocabulary.

    Written with the log-sum-exp and a one-hot mask rather than `log_softmax` + a gather and
    `argmax`: the same numbers, but the backward pass is elementwise (a gather's transpose is a
    scatter into a zero array the size of the logits) and "argmax is right" is one comparison
    and one integer `min` over the vocabulary (on a CPU the variadic argmax reduction was the
    slowest part of the loss). Ties count as `argmax` does: only the first top token is right.
    """
    logits = logits.astype(jnp.float32)
    width = logits.shape[-1]
    vocab = width if vocab_size is None else vocab_size
    ids = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
    if vocab < width:
        logits = jnp.where(ids < vocab, logits, np.float32(np.finfo(np.float32).min))
    top = jnp.max(logits, axis=-1, keepdims=True)
    shifted = logits - jax.lax.stop_gradient(top)
    log_normalizer = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    target_shifted = jnp.sum(jnp.where(ids == targets[..., None], shifted, 0.0), axis=-1)
    nll = log_normalizer - target_shifted
    objective = nll
    if label_smoothing > 0.0:
        if vocab == width:
            mean = jnp.mean(shifted, axis=-1)
        else:
            mean = jnp.sum(jnp.where(ids < vocab, shifted, 0.0), axis=-1) / vocab
        uniform = log_normalizer - mean
        objective = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    first_top = jnp.min(jnp.where(logits == top, ids, vocab), axis=-1)
    correct = first_top == targets
    return objective, nll, correct


def weighted_stats(
    objective: Float[Array, "*positions"],
    nll: Float[Array, "*positions"],
    correct: Bool[Array, "*positions"],
    weight: Bool[Array, "*positions"] | Float[Array, "*positions"],
) -> Stats:
    """Sum the per-position values over the positions that count (weight 1) into `Stats`."""
    weight = weight.astype(jnp.float32)
    return Stats(
        loss_sum=jnp.sum(objective * weight),
        nll_sum=jnp.sum(nll * weight),
        weight=jnp.sum(weight),
        correct=jnp.sum(correct.astype(jnp.float32) * weight),
    )


def example_keys(key: PRNGKeyArray | None, batch_size: int) -> Array | None:
    """One dropout key per example (None stays None: no dropout)."""
    return None if key is None else jax.random.split(key, batch_size)


# The task that trains each flavor (for error messages and `zoo train`).
TASK_FOR_FLAVOR = {
    "classifier": "Classification",
    "gpt": "LanguageModeling",
    "translator": "Translation",
}


class Task(abc.ABC, Generic[ModelT]):
    """Batch -> summed `Stats`, by vmapping a per-example model of the flavor `ModelT`.
    Subclasses fill the blanks."""

    flavor: ClassVar[str]  # the model flavor this task trains
    metric_name: ClassVar[str]  # name of the headline metric
    lower_is_better: ClassVar[bool] = False  # direction of the headline metric
    required: ClassVar[dict[str, str]]  # batch key -> shape description (rank = words)
    optional: ClassVar[dict[str, str]] = {}  # optional batch keys, same form

    # -- what a subclass provides ---------------------------------------------------------------

    @abc.abstractmethod
    def statistics(
        self, model: ModelT, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None = None
    ) -> Stats:
        """Summed statistics of `batch`; pure JAX, safe to call under jit/grad."""

    @abc.abstractmethod
    def _check_values(self, batch: Mapping[str, np.ndarray], model: ModelT) -> None:
        """Task-specific checks of the values (ids against the vocabulary, label range)."""

    # -- shared behaviour -----------------------------------------------------------------------

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={value!r}" for name, value in sorted(vars(self).items()))
        return f"{type(self).__name__}({options})"

    def metric(self, stats: Stats) -> Float[Array, ""]:
        """The headline metric from summed statistics."""
        return stats.accuracy

    def metrics(self, stats: Stats) -> dict[str, Float[Array, ""]]:
        """More metrics by name, logged beside the headline one: each named sum of
        `stats.extra` per scored position (none for most tasks)."""
        weight = jnp.maximum(stats.weight, 1.0)
        return {name: total / weight for name, total in stats.extra.items()}

    def __call__(
        self, model: ModelT, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None = None
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """(mean loss, metrics) of one batch: the convenient form of `statistics`."""
        stats = self.statistics(model, batch, key=key)
        named = {"loss": stats.loss, self.metric_name: self.metric(stats)}
        return stats.loss, {**self.metrics(stats), **named}

    def check_model(self, model: object) -> None:
        """Raise TypeError if `model` is not the flavor this task trains."""
        from zoo.models import FLAVORS, flavor_of

        expected = FLAVORS[self.flavor][1]
        if isinstance(model, expected):
            return
        try:
            other = flavor_of(model)
        except TypeError:
            other = None
        hint = f"; for a {other} use zoo.tasks.{TASK_FOR_FLAVOR[other]}()" if other else ""
        raise TypeError(
            f"{type(self).__name__} trains a zoo.{expected.__name__} ({self.flavor}), "
            f"got {type(model).__name__}{hint}"
        )

    def check_batch(self, batch: Mapping[str, ArrayLike], model: ModelT) -> None:
        """Raise ValueError (saying what was expected) if `batch` does not fit this task/model.

        Runs on the host before anything is compiled: keys, ranks, batch sizes, dtypes, then
        the task's value checks (token ids, labels).
        """
        if not isinstance(batch, Mapping):
            raise TypeError(f"a batch is a dict of arrays, got {type(batch).__name__}")
        task = type(self).__name__
        wanted = ", ".join(f"{k} {v}" for k, v in self.required.items())
        missing = [k for k in self.required if k not in batch]
        if missing:
            raise ValueError(
                f"{task} batch is missing {missing}: it needs {wanted} "
                f"(got keys {sorted(batch)}); see zoo.data.batches for the batch format"
            )
        arrays = {}
        for name, shape in {**self.required, **self.optional}.items():
            if name not in batch:
                continue
            value = np.asarray(batch[name])
            rank = len(shape.strip("[]").split())
            if value.ndim != rank:
                raise ValueError(
                    f"{task} batch[{name!r}] must be {shape} (rank {rank}), got shape "
                    f"{value.shape}; batches have the batch axis first"
                )
            if not (np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_):
                raise ValueError(f"batch[{name!r}] must hold integers, got dtype {value.dtype}")
            arrays[name] = value
        sizes = {name: value.shape[0] for name, value in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{task} batch arrays disagree on the batch size: {sizes}")
        if next(iter(sizes.values())) == 0:
            raise ValueError(f"{task} batch is empty (batch size 0)")
        self._check_values(arrays, model)

    def num_tokens(self, batch: Mapping[str, ArrayLike]) -> int:
        """Token positions the model reads in `batch` (padding included), for tokens/s."""
        return int(sum(np.size(batch[name]) for name in self.required if name != "labels"))


def check_ids(
    name: str, ids: np.ndarray, vocab_size: int, max_positions: int, *, shifted: bool = False
) -> None:
    """Token ids in `[0, vocab_size)` and a length the model accepts.

    `shifted`: the model reads all positions but the last (which is only a target), so the
    array may be one longer than `max_positions` and needs at least two positions.
    """
    length = ids.shape[1]
    read = length - 1 if shifted else length
    if read < 1:
        raise ValueError(
            f"batch[{name!r}] has {length} positions; it needs at least {2 if shifted else 1}"
        )
    if read > max_positions:
        reads = f" (the model reads {read}: all but the last)" if shifted else ""
        raise ValueError(
            f"batch[{name!r}] has {length} positions{reads} but the model takes at most "
            f"max_positions={max_positions}; truncate the data or build a larger model"
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"batch[{name!r}] holds ids in [{low}, {high}] but the model's vocabulary is "
            f"[0, {vocab_size}); build the model with vocab_size >= the tokenizer's vocab_size"
        )


def target_weights(
    targets: Int[Array, "*positions"], pad_id: int | None
) -> Bool[Array, "*positions"]:
    """True where a target is a real token (everything, when the model has no pad_id)."""
    if pad_id is None:
        return jnp.ones(targets.shape, bool)
    return targets != pad_id
