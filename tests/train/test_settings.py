"""`LoopSettings` and `Outputs`: each checks its fields once, and `Trainer` and `Trainer.fit`
take them as one record each (their fields are no keywords of the calls)."""

from __future__ import annotations

import threading

import jax
import pytest

import zoo
from tests.train.helpers import lm_batches
from zoo.train import LoopSettings, Outputs, Trainer, adamw
from zoo.train.lock import RunLock

TASK = zoo.tasks.LanguageModeling()


def test_the_trainer_takes_its_loop_settings_as_one_record():
    loop = LoopSettings(log_every=1, eval_every=2, eval_limit=3, checkpoint_every=4, keep=5,
                        progress=False, loggers=())  # fmt: skip
    trainer = Trainer(TASK, adamw(1e-3), loop=loop)
    assert trainer.loop == loop
    assert trainer.train_step is Trainer(TASK, adamw(1e-3)).train_step  # the loop is no part
    assert (trainer.log_every, trainer.eval_every, trainer.eval_limit) == (1, 2, 3)
    assert (trainer.checkpoint_every, trainer.keep, trainer.progress) == (4, 5, False)
    for name in ("log_every", "eval_every", "keep", "progress", "loggers", "every"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            Trainer(TASK, **{name: 3})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"log_every": 0}, "log_every must be a positive integer, got 0"),
        ({"keep": 0}, "keep must be a positive integer, got 0"),
        ({"eval_every": -1}, "eval_every must be a positive integer or None, got -1"),
        ({"eval_limit": 0}, "eval_limit must be a positive integer or None, got 0"),
        ({"checkpoint_every": 0}, "checkpoint_every must be a positive integer or None, got 0"),
        ({"loggers": ["mlflow"]}, "unknown logger 'mlflow'"),
    ],
)
def test_loop_settings_name_the_field_they_refuse(fields, message):
    with pytest.raises(ValueError, match=message):
        LoopSettings(**fields)


class Recorder:
    def log(self, row):
        pass

    def close(self):
        pass


def test_loop_settings_keep_the_loggers_as_a_tuple():
    recorder = Recorder()
    assert LoopSettings(loggers=[recorder]).loggers == (recorder,)
    assert LoopSettings(loggers=recorder).loggers == (recorder,)
    assert LoopSettings().loggers == ()


def test_outputs_default_out_dir_to_the_checkpoint_dir_and_need_a_folder_to_plot(tmp_path):
    assert Outputs(tmp_path).folder == Outputs(tmp_path).checkpoints == tmp_path
    assert Outputs(tmp_path / "c", tmp_path).folder == tmp_path
    assert Outputs().folder is None and Outputs().checkpoints is None
    with pytest.raises(ValueError, match=r"plot=True needs out_dir \(or checkpoint_dir\)"):
        Outputs(plot=True)


@pytest.mark.parametrize("name", ["checkpoint_dir", "out_dir", "tokenizer", "plot", "output_dir"])
def test_fit_takes_where_it_writes_as_one_record(tmp_path, tiny_gpt, name):
    trainer = Trainer(TASK, adamw(3e-3), loop=LoopSettings(progress=False))
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        trainer.fit(tiny_gpt, lm_batches(), steps=1, key=jax.random.key(1), **{name: tmp_path})
    assert list(tmp_path.iterdir()) == []  # refused before the run wrote anything


def test_the_run_lock_is_reentrant_in_its_thread_only(tmp_path):
    with RunLock(tmp_path), RunLock(tmp_path / "checkpoints", tmp_path):  # zoo train, then fit
        refused = []

        def other_thread():
            try:
                with RunLock(tmp_path):
                    pass
            except ValueError as error:
                refused.append(str(error))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(refused) == 1 and "is in use by another training run" in refused[0]
    with RunLock(tmp_path):  # given back when the outermost holder is done
        pass
