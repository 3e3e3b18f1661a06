"""`zoo demo`: train each flavor on a built-in synthetic task, offline, in about a minute each.

| flavor | task | held-out metric |
| --- | --- | --- |
| translator | rot13 of random words (`hey -> url`) | exact match of the whole output |
| gpt | two-digit addition (`57+68=125`) | exact match of the answer |
| classifier | which letter group is more frequent | accuracy |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Int

from zoo.data import synthetic
from zoo.models import GPT, Classifier, Translator
from zoo.presets import count_params, create
from zoo.tasks import for_flavor
from zoo.train.history import Logged
from zoo.train.optim import adamw
from zoo.train.settings import LoopSettings, Outputs
from zoo.train.trainer import Trainer

FLAVOR_ORDER = ("translator", "gpt", "classifier")


@dataclass(frozen=True)
class DemoSpec:
    """How the demo trains one flavor."""

    flavor: str
    data: str  # synthetic task name
    preset: str
    steps: int
    batch_size: int
    lr: float
    warmup: int
    schedule: str = "cosine"
    data_options: dict[str, int] = field(default_factory=dict)  # for the task's builder
    num_train: int | None = None  # the task's default
    num_eval: int = 1000


SPECS = {
    "translator": DemoSpec("translator", "rot13", "translator-tiny", 500, 64, 3e-3, 50),
    "gpt": DemoSpec("gpt", "addition", "gpt-tiny", 2000, 64, 3e-3, 100),
    "classifier": DemoSpec("classifier", "majority", "classifier-tiny", 300, 64, 1e-3, 30),
}


# ------------------------------------------------------------------------------------------
# held-out exact match from one teacher-forced pass
# ------------------------------------------------------------------------------------------


@eqx.filter_jit
def _argmax_predictions(
    model: GPT | Classifier | Translator, arrays: dict[str, Array]
) -> tuple[Array, Array]:
    """(predicted ids, scored positions) for every eval example, from one forward pass."""
    if isinstance(model, Translator):
        targets = arrays["tgt"][:, 1:]
        logits = jax.vmap(lambda s, t: model(s, t))(arrays["src"], arrays["tgt"][:, :-1])
        pad = model.config.pad_id
        scored = jnp.ones(targets.shape, bool) if pad is None else jnp.not_equal(targets, pad)
    elif "loss_mask" in arrays:
        logits = jax.vmap(lambda t: model(t))(arrays["tokens"][:, :-1])
        scored = arrays["loss_mask"][:, 1:] != 0
    else:
        logits = jax.vmap(lambda t: model(t))(arrays["tokens"])
        scored = jnp.ones(arrays["labels"].shape, bool)
    return jnp.argmax(logits, axis=-1), scored


def exact_match(
    predictions: Int[ArrayLike, "batch ..."],
    references: Int[ArrayLike, "batch ..."],
    scored: Bool[ArrayLike, "batch ..."],
) -> np.ndarray:
    """Per example: is every scored position's prediction right?

    With teacher forcing, position t's argmax is the token greedy decoding would emit after
    the reference prefix `ref[:t+1]`. So the greedy output equals the reference (eos included)
    exactly when the argmax is right at every reference position: if all are right, greedy
    reproduces the reference one token at a time; if the first wrong one is at t, greedy had the
    same prefix up to t and emits the wrong token there. One teacher-forced pass therefore gives
    greedy exact-match, not an approximation of it.
    """
    right = (np.asarray(predictions) == np.asarray(references)) | ~np.asarray(scored, bool)
    return right.reshape(right.shape[0], -1).all(axis=1)


def held_out_accuracy(model: eqx.Module, data: synthetic.SyntheticData) -> tuple[float, list[str]]:
    """(exact-match accuracy on the eval split, the argmax prediction text of each example)."""
    if not isinstance(model, GPT | Classifier | Translator):
        raise TypeError(f"held_out_accuracy needs a zoo model, got {type(model).__name__}")
    arrays = {name: jnp.asarray(value) for name, value in data.eval.items()}
    predictions, scored = _argmax_predictions(model, arrays)
    tokenizer = data.tokenizer
    if data.flavor == "translator":
        references = arrays["tgt"][:, 1:]
        texts = [tokenizer.decode(row) for row in np.asarray(predictions).tolist()]
    elif data.flavor == "gpt":
        references = arrays["tokens"][:, 1:]
        rows = zip(np.asarray(predictions), np.asarray(scored), strict=True)
        texts = [tokenizer.decode(row[mask].tolist()) for row, mask in rows]
    else:
        references = arrays["labels"]
        texts = [str(int(label)) for label in np.asarray(predictions)]
    correct = exact_match(predictions, references, scored)
    return float(correct.mean()), texts


# ------------------------------------------------------------------------------------------
# one flavor, all flavors, the table
# ------------------------------------------------------------------------------------------


class DemoRow(TypedDict):
    """One flavor's line of the demo's table (and of `zoo demo --json`)."""

    flavor: str
    task: str  # the synthetic task
    params: int
    steps: int
    seconds: float  # data, training and evaluation
    tokens_per_s: float | None
    metric: str  # "exact match" or "accuracy"
    value: float  # the metric on the held-out examples
    final_loss: Logged | None  # the last logged training loss


def run_flavor(
    flavor: str,
    *,
    steps: int | None = None,
    seed: int = 0,
    out_dir: str | None = None,
    progress: bool = True,
    examples: int = 5,
    echo: Callable[[str], object] = print,
) -> DemoRow:
    """Generate the flavor's task, train its tiny preset, measure held-out accuracy; one row.

    Args:
        flavor: "gpt", "classifier" or "translator".
        steps: training steps; None takes the flavor's own default.
        seed: seeds the generated data, the model and training.
        out_dir: a folder the run writes its model and checkpoints to (None: nothing is written).
        progress: show a progress bar while training.
        examples: held-out examples printed with the model's answers.
        echo: where lines are printed.
    """
    if flavor not in SPECS:
        raise ValueError(f"unknown flavor {flavor!r}; choose one of {list(FLAVOR_ORDER)}")
    spec = SPECS[flavor]
    steps = spec.steps if steps is None else steps
    started = time.perf_counter()
    data = synthetic.make(
        spec.data, num_train=spec.num_train, num_eval=spec.num_eval, seed=seed, **spec.data_options
    )
    tokenizer = data.tokenizer
    overrides: dict[str, int | None] = dict(
        vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id
    )
    if flavor == "classifier":
        overrides["num_classes"] = data.num_classes
    else:
        overrides.update(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    key = jax.random.key(seed)
    model_key, train_key = jax.random.split(key)
    model = create(spec.preset, key=model_key, **overrides)
    train, _ = data.batches(spec.batch_size, seed=seed)
    optimizer = adamw(spec.lr, warmup=spec.warmup, schedule=spec.schedule, total_steps=steps)
    loop = LoopSettings(log_every=50, progress=progress)
    trainer = Trainer(for_flavor(flavor), optimizer, loop=loop)
    echo(f"[{flavor}] {data.description}: {spec.preset}, {steps} steps of {spec.batch_size}")
    outputs = Outputs(out_dir=out_dir, tokenizer=tokenizer)
    model, history = trainer.fit(model, train, steps=steps, key=train_key, outputs=outputs)
    accuracy, predictions = held_out_accuracy(model, data)
    seconds = time.perf_counter() - started
    for (source, reference), predicted in list(zip(data.eval_text, predictions))[:examples]:
        mark = "ok" if predicted == reference else f"(expected {reference})"
        echo(f"    {source} -> {predicted}  {mark}")
    metric = "accuracy" if flavor == "classifier" else "exact match"
    echo(f"[{flavor}] held-out {metric}: {accuracy:.1%} in {seconds:.1f}s")
    final = history.summary["final_train"]
    return {
        "flavor": flavor,
        "task": spec.data,
        "params": count_params(model),
        "steps": history.summary["steps"],
        "seconds": round(seconds, 1),
        "tokens_per_s": history.summary["tokens_per_s"],
        "metric": metric,
        "value": round(accuracy, 4),
        "final_loss": None if final is None else final["loss"],
    }


def format_table(rows: list[DemoRow]) -> str:
    header = (
        f"{'flavor':<11} {'task':<9} {'params':>9} {'steps':>6} {'time':>7} {'tokens/s':>9}  metric"
    )
    lines = [header, "-" * (len(header) + 22)]
    for r in rows:
        rate = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        lines.append(
            f"{r['flavor']:<11} {r['task']:<9} {r['params']:>9,} {r['steps']:>6} "
            f"{r['seconds']:>6.1f}s {rate:>9}  {r['metric']} {r['value']:.1%}"
        )
    return "\n".join(lines)
