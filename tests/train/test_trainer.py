"""The training loop: learning, exact resume, Ctrl-C, NaN stop, export, errors before compiling."""

from __future__ import annotations

import json
import os
import signal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.train.helpers import lm_batches, params, sharing
from zoo.data.batches import ArrayBatches
from zoo.data.tokenizers.char import CharTokenizer
from zoo.tasks import LanguageModeling, Stats, Translation
from zoo.train import (
    LoopSettings,
    Outputs,
    Terminated,
    Trainer,
    TrainingDiverged,
    adamw,
    latest_checkpoint,
    load_checkpoint,
)
from zoo.train import checkpoint as ckpt
from zoo.train.step import StepOutput

TASK = LanguageModeling()


@pytest.fixture(scope="module")
def model():
    # Dropout on, so the resumed run must also restore the RNG to match.
    return zoo.create("gpt-tiny", key=jax.random.key(0), dropout=0.1)


@pytest.fixture(scope="module")
def trainer():
    loop = LoopSettings(log_every=1, checkpoint_every=2, progress=False)
    return Trainer(TASK, adamw(3e-3, warmup=3), loop=loop)


class Interrupted:
    """A batch source that raises KeyboardInterrupt when asked for batch `at`."""

    def __init__(self, source, at):
        self.source, self.at = source, at

    def __len__(self):
        return len(self.source)

    def batch(self, step):
        if step == self.at:
            raise KeyboardInterrupt
        return self.source.batch(step)


def test_a_few_steps_reduce_the_loss_and_leave_the_input_model_alone(model, trainer):
    before = params(model)
    _, history = trainer.fit(model, lm_batches(), steps=8, key=jax.random.key(1))
    losses = history.losses()
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(np.array_equal(before[n], a) for n, a in params(model).items())
    assert history.summary["steps"] == 8 and history.summary["tokens_per_s"] > 0


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(tmp_path, model, trainer):
    data, key = lm_batches(), jax.random.key(1)
    full, full_history = trainer.fit(
        model, data, steps=6, key=key, outputs=Outputs(tmp_path / "full")
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(
            model, Interrupted(data, at=3), steps=6, key=key, outputs=Outputs(tmp_path / "run")
        )
    assert latest_checkpoint(tmp_path / "run").name == "step_00000003"  # saved on Ctrl-C
    # The key passed here is ignored: the checkpoint's RNG state wins.
    resumed, history = trainer.fit(
        model, data, steps=6, key=jax.random.key(99), outputs=Outputs(tmp_path / "run"), resume=True
    )
    assert history.summary["resumed_from"] == 3
    np.testing.assert_allclose(history.losses(), full_history.losses(), rtol=0, atol=1e-6)
    for name, array in params(full).items():
        np.testing.assert_allclose(params(resumed)[name], array, rtol=0, atol=1e-6, err_msg=name)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert set(rows[0]) >= {"step", "split", "loss", "metric", "tokens_per_s", "lr"}
    assert rows[0]["lr"] == pytest.approx(1e-3)  # warmup: 3e-3 * 1/3


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, model, trainer):
    checked = sharing(trainer, log_every=3, checkpoint_every=2)

    def step_with_nan_at_5(model, opt_state, batch, key, step):
        model, opt_state, output = trainer.train_step(model, opt_state, batch, key, step)
        if step + 1 == 5:  # update number 5 produces a NaN loss
            nan = output.stats.loss_sum * jnp.nan
            output = StepOutput(Stats(nan, nan, output.stats.weight, nan), output.grad_norm)
        return model, opt_state, output

    checked.train_step = step_with_nan_at_5
    with pytest.raises(TrainingDiverged, match="stopped at step 5: the loss is nan") as error:
        checked.fit(model, lm_batches(), steps=10, key=jax.random.key(0), outputs=Outputs(tmp_path))
    assert error.value.step == 5
    assert "step_00000004" in str(error.value)  # detected at step 6 (a log step): 4 is kept
    assert [p.name for p in sorted(tmp_path.glob("step_*"))] == ["step_00000002", "step_00000004"]
    restored = load_checkpoint(
        latest_checkpoint(tmp_path), model=model, opt_state=trainer.init_optimizer(model)
    )
    assert all(np.isfinite(a).all() for a in params(restored.model).values())


def with_an_infinite_weight(model):
    leaves, treedef = jax.tree_util.tree_flatten(model)
    first = next(i for i, leaf in enumerate(leaves) if eqx.is_inexact_array(leaf))
    leaves[first] = leaves[first].at[0].set(jnp.inf)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def test_weights_made_infinite_by_an_update_are_never_checkpointed(tmp_path, model, trainer):
    checked = sharing(trainer, log_every=1, checkpoint_every=2)

    def step_leaving_inf_weights_at_4(model, opt_state, batch, key, step):
        model, opt_state, output = trainer.train_step(model, opt_state, batch, key, step)
        if step + 1 == 4:  # its loss (computed before the update) is finite, the weights not
            model = with_an_infinite_weight(model)
        return model, opt_state, output

    checked.train_step = step_leaving_inf_weights_at_4
    with pytest.raises(TrainingDiverged) as error:
        checked.fit(model, lm_batches(), steps=10, key=jax.random.key(0), outputs=Outputs(tmp_path))
    assert str(error.value).startswith(
        "training stopped at step 4: the weights after this update are not finite (NaN or inf). "
        f"The last good checkpoint is kept: {tmp_path / 'step_00000002'}."
    )
    assert [p.name for p in sorted(tmp_path.glob("step_*"))] == ["step_00000002"]
    # A non-finite checkpoint (say from an older zoo) is skipped when resuming.
    ckpt.save_checkpoint(tmp_path, step=4, model=with_an_infinite_weight(model),
                         opt_state=trainer.init_optimizer(model), key=jax.random.key(0))  # fmt: skip
    with pytest.warns(UserWarning, match="skipped checkpoint step_00000004: its weights are not"):
        _, history = trainer.fit(model, lm_batches(), steps=3, key=jax.random.key(0),
                                 outputs=Outputs(tmp_path), resume=True)  # fmt: skip
    assert history.summary["resumed_from"] == 2


@pytest.mark.parametrize(
    ("signum", "raised", "handler"),
    [
        (signal.SIGINT, KeyboardInterrupt, signal.default_int_handler),  # Ctrl-C
        (signal.SIGTERM, Terminated, signal.SIG_DFL),  # a scheduler's notice before preemption
    ],
)
def test_a_signal_inside_a_step_waits_for_the_step_and_saves_it(
    tmp_path, model, trainer, signum, raised, handler
):
    interrupted = sharing(trainer, checkpoint_every=100)

    def step_hit_by_a_signal_at_3(model, opt_state, batch, key, step):
        if step + 1 == 3:  # the signal arrives while update 3 runs (its inputs are being donated)
            os.kill(os.getpid(), signum)
        return trainer.train_step(model, opt_state, batch, key, step)

    interrupted.train_step = step_hit_by_a_signal_at_3
    # Python's own handler to start from, also where the process inherited SIGINT ignored
    # (a job started in the background by a shell)
    inherited = signal.signal(signum, handler)
    try:
        with pytest.raises(KeyboardInterrupt) as error:
            interrupted.fit(
                model, lm_batches(), steps=10, key=jax.random.key(0), outputs=Outputs(tmp_path)
            )
        restored_handler = signal.getsignal(signum)
    finally:
        signal.signal(signum, inherited)
    assert error.type is raised
    assert latest_checkpoint(tmp_path).name == "step_00000003"  # update 3 finished and was saved
    restored = load_checkpoint(
        latest_checkpoint(tmp_path), model=model, opt_state=trainer.init_optimizer(model)
    )
    assert restored.data_position == 3
    assert restored_handler is handler  # handler restored


def test_final_model_loads_bit_for_bit_with_its_tokenizer(tmp_path, model, trainer):
    tokenizer = CharTokenizer("abcdefghijklmnop")
    outputs = Outputs(out_dir=tmp_path, tokenizer=tokenizer, plot=True)
    trained, _ = trainer.fit(model, lm_batches(), steps=2, key=jax.random.key(0), outputs=outputs)
    loaded, loaded_tokenizer = zoo.serialize.load_with_tokenizer(tmp_path)
    for name, array in params(trained).items():
        np.testing.assert_array_equal(params(loaded)[name], array, err_msg=name)
    assert loaded_tokenizer.encode("abc") == tokenizer.encode("abc")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "config.json").read_text())["training"]["steps"] == 2


def test_a_new_batch_shape_warns_about_recompiling(model):
    class TwoShapes:
        def __len__(self):
            return 2

        def batch(self, step):
            return lm_batches(length=12 if step == 0 else 10).batch(step)

    loop_only = Trainer(TASK, adamw(1e-3), loop=LoopSettings(progress=False))
    zero = StepOutput(Stats.zero(), jnp.zeros(()))
    loop_only.train_step = lambda model, opt_state, *_: (model, opt_state, zero)
    with pytest.warns(UserWarning, match=r"step 2: new batch shapes .* compile the step again"):
        loop_only.fit(model, TwoShapes(), steps=2, key=jax.random.key(0))


class Empty:
    def __len__(self):
        return 0

    def batch(self, step):
        raise IndexError(step)


def test_bad_inputs_fail_before_anything_compiles(tmp_path, model):
    trainer = Trainer(TASK, adamw(1e-3), accumulate=3, loop=LoopSettings(progress=False))

    def must_not_run(*args, **kwargs):
        raise AssertionError("the step was compiled and run")

    trainer.train_step = must_not_run
    key = jax.random.key(0)
    with pytest.raises(TypeError, match=r"Translation trains a zoo\.Translator"):
        Trainer(Translation(), loop=LoopSettings(progress=False)).fit(
            model, lm_batches(), steps=1, key=key
        )
    with pytest.raises(ValueError, match="train_batches is empty"):
        trainer.fit(model, Empty(), steps=1, key=key)
    with pytest.raises(ValueError, match="eval_batches is empty"):
        trainer.fit(model, lm_batches(batch_size=6), eval_batches=Empty(), steps=1, key=key)
    with pytest.raises(ValueError, match="batch size 8 is not a multiple of accumulate=3"):
        trainer.fit(model, lm_batches(), steps=1, key=key)
    bad_rank = ArrayBatches({"tokens": np.ones((12,), np.int32)}, 6)
    with pytest.raises(ValueError, match=r"must be \[batch, seq\] \(rank 2\)"):
        trainer.fit(model, bad_rank, steps=1, key=key)
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        trainer.fit(model, lm_batches(batch_size=6), steps=1, key=key, resume=True)
    ckpt.save_checkpoint(tmp_path, step=4, model=model, opt_state=trainer.init_optimizer(model),
                         key=key)  # fmt: skip
    with pytest.raises(ValueError, match=r"already holds checkpoints .* resume=True"):
        trainer.fit(model, lm_batches(batch_size=6), steps=1, key=key, outputs=Outputs(tmp_path))
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        trainer.fit(model, lm_batches(batch_size=6), steps=0, key=key)
    with pytest.raises(ValueError, match="precision must be one of"):
        Trainer(TASK, precision="fp16")


def test_plotting_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    from zoo.train.history import History
    from zoo.train.plot import plot_history

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[plot\]'"):
        plot_history(History(), tmp_path / "curves.png")


class TwoShapes:
    """Batches of length 8 on even steps and 12 on odd ones; `lengths` declares buckets."""

    def __init__(self, declare_buckets):
        self.short, self.long = lm_batches(length=8), lm_batches(length=12)
        if declare_buckets:
            self.lengths = (8, 12)

    def __len__(self):
        return len(self.short)

    def batch(self, step):
        return (self.short if step % 2 == 0 else self.long).batch(step)


@pytest.mark.parametrize("declare_buckets", [False, True])
def test_a_new_batch_shape_warns_unless_the_source_declares_its_buckets(
    model, trainer, declare_buckets, recwarn
):
    sharing(trainer).fit(model, TwoShapes(declare_buckets), steps=3, key=jax.random.key(0))
    compiles = [w for w in recwarn if "make XLA compile the step again" in str(w.message)]
    assert len(compiles) == (0 if declare_buckets else 1)
