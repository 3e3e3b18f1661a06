"""The jitted step: accumulation equals one big batch, bf16 compute, every flavor learns."""

from __future__ import annotations

from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zoo
from zoo import demo
from zoo.data import synthetic
from zoo.models import Routed
from zoo.nn.vocab import VocabHead
from zoo.serialize import named_arrays
from zoo.tasks import Classification, LanguageModeling, Translation
from zoo.train import LoopSettings, Trainer, adamw
from zoo.train.step import make_train_step


def params(model):
    return {name: np.asarray(a) for name, a in named_arrays(model).items()}


class Bigram(eqx.Module):
    """A GPT-shaped model small enough to compile instantly: logits = table[token] @ proj."""

    table: jax.Array
    proj: jax.Array
    config: SimpleNamespace = eqx.field(static=True)

    def features_and_router(self, tokens, mask=None, *, segments=None, key=None):
        return Routed(jnp.tanh(self.table[tokens]), None)

    @property
    def output_head(self) -> VocabHead:  # the language-modelling loss starts from features
        return VocabHead(self.proj.T)

    def __call__(self, tokens, mask=None, *, key=None):
        return self.output_head(self.features_and_router(tokens).output)


def test_gradient_accumulation_equals_one_big_batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 12, (8, 10)).astype(np.int32)
    # Very different amounts of padding per row: micro-batches hold different token counts, so
    # averaging per micro-batch would be wrong; the step must weigh every token equally.
    for row, length in enumerate([10, 3, 7, 2, 10, 5, 4, 9]):
        tokens[row, length:] = 0
    k1, k2 = jax.random.split(jax.random.key(0))
    model = Bigram(
        jax.random.normal(k1, (12, 8)), jax.random.normal(k2, (8, 12)), SimpleNamespace(pad_id=0)
    )
    sgd = optax.sgd(1.0)  # plain SGD: the parameter change is the gradient itself
    results = []
    for accumulate in (1, 2, 4):
        step = make_train_step(LanguageModeling(), sgd, accumulate=accumulate)
        fresh = jax.tree_util.tree_map(jnp.copy, model)  # the step donates its inputs
        state = sgd.init(eqx.filter(fresh, eqx.is_inexact_array))
        trained, _, output = step(fresh, state, {"tokens": tokens}, jax.random.key(1), 0)
        results.append((trained, float(output.stats.loss), float(output.stats.weight)))
    (whole, whole_loss, weight), *accumulated = results
    assert weight == 42.0  # scored next-token targets: sum(lengths) - one per row = 50 - 8
    assert float(jnp.abs(whole.table - model.table).max()) > 1e-3  # the step moved the weights
    for trained, loss, _ in accumulated:
        assert loss == pytest.approx(whole_loss, abs=1e-6)
        np.testing.assert_allclose(trained.table, whole.table, rtol=0, atol=1e-6)
        np.testing.assert_allclose(trained.proj, whole.proj, rtol=0, atol=1e-6)


def test_translator_learns_rot13():
    # The demo's settings, so the compiled step is shared with tests/test_demo.py.
    spec = demo.SPECS["translator"]
    data = synthetic.make("rot13", num_train=spec.batch_size * 4, num_eval=8, seed=0)
    train, _ = data.batches(spec.batch_size)
    model = zoo.create(
        "translator-tiny", key=jax.random.key(0), vocab_size=data.tokenizer.vocab_size
    )
    optimizer = adamw(spec.lr, warmup=spec.warmup, schedule=spec.schedule, total_steps=spec.steps)
    trainer = Trainer(Translation(), optimizer, loop=LoopSettings(log_every=1, progress=False))
    _, history = trainer.fit(model, train, steps=30, key=jax.random.key(1))
    losses = history.losses()
    # An untrained model predicts nearly uniformly: the loss starts at log(vocab).
    assert losses[0] == pytest.approx(np.log(30), abs=0.05)
    assert losses[-1] < losses[0] - 0.2, [round(loss, 3) for loss in losses]


def test_classifier_learns_in_bf16_with_accumulation_and_fp32_master_weights():
    data = synthetic.make("majority", num_train=512, num_eval=8, seed=0)
    train, _ = data.batches(32)
    model = zoo.create("classifier-tiny", key=jax.random.key(0), vocab_size=30)
    trainer = Trainer(Classification(), adamw(3e-3, warmup=2), precision="bf16", accumulate=2,
                      loop=LoopSettings(log_every=4, progress=False))  # fmt: skip
    trained, history = trainer.fit(model, train, steps=16, key=jax.random.key(1))
    rows = history.split("train")
    assert rows[0]["loss"] == pytest.approx(np.log(2), abs=0.05)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.2, rows
    assert rows[-1]["metric"] > 0.7 and rows[-1]["metric_name"] == "accuracy"
    assert {a.dtype for a in params(trained).values()} == {np.dtype("float32")}
