"""The Trainer's steps check each batch's token ids on the host, so their compiled programs hold
no host callback (which JAX's persistent compilation cache would not keep); a step built
without host checks keeps the check inside the program. Either way a bad id is an error."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.nn.embedding import check_token_ids, ids_checked_on_host
from zoo.train.step import make_eval_step, make_train_step


@pytest.fixture(scope="module")
def setup():
    model = zoo.create("llama-tiny", key=jax.random.key(0))
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), precision="fp32")
    vocab = model.config.vocab_size
    tokens = np.random.default_rng(0).integers(3, vocab, (2, 9)).astype(np.int32)
    return model, trainer, trainer.init_optimizer(model), tokens


def _has_callback(step, model, state, tokens) -> bool:
    text = step.lower(model, state, {"tokens": tokens}, jax.random.key(1), 1).as_text()
    return "callback" in text


def test_the_trainers_step_has_no_callback_and_a_plain_step_keeps_its_check(setup):
    model, trainer, state, tokens = setup
    assert not _has_callback(trainer.train_step, model, state, tokens)
    plain = make_train_step(trainer.task, trainer.optimizer)
    assert _has_callback(plain, model, state, tokens)


def test_a_bad_id_is_an_error_on_every_path(setup):
    model, trainer, state, tokens = setup
    bad = tokens.copy()
    bad[1, 4] = model.config.vocab_size  # one past the vocabulary
    with pytest.raises(
        ValueError, match=r"holds ids in \[\d+, 64\] but the model.s vocabulary is \[0, 64\)"
    ):
        trainer.train_step(model, state, {"tokens": bad}, jax.random.key(1), 1)
    with pytest.raises(
        ValueError, match=r"holds ids in \[\d+, 64\] but the model.s vocabulary is \[0, 64\)"
    ):
        trainer.eval_step(model, {"tokens": bad})
    plain = make_eval_step(trainer.task)  # no host check: the program's own check raises
    with pytest.raises(Exception, match=r"outside \[0, 64\)"):
        jax.block_until_ready(plain(model, {"tokens": bad}))


def test_host_checked_and_device_checked_steps_agree(setup):
    model, trainer, _, tokens = setup
    checked = trainer.eval_step(model, {"tokens": tokens})
    plain = make_eval_step(trainer.task)(model, {"tokens": tokens})
    assert float(checked.loss_sum) == pytest.approx(float(plain.loss_sum), rel=1e-6)
    assert float(checked.weight) == float(plain.weight) == tokens.size - tokens.shape[0]


def test_the_scope_lifts_the_check_while_tracing_only():
    ids = jnp.array([0, 5, 9])

    def program():  # a new function each time: JAX caches traces by function
        return jax.jit(lambda ids: check_token_ids(ids, 4))

    with pytest.raises(Exception, match=r"outside \[0, 4\)"):
        jax.block_until_ready(program()(ids))
    with ids_checked_on_host():
        assert "callback" not in program().lower(ids).as_text()
    assert "callback" in program().lower(ids).as_text()
