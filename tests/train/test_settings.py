"""`LoopSettings` and `Outputs`: each checks its fields once, and the older loose keywords of
`Trainer` and `Trainer.fit` still work, with a DeprecationWarning, to the same effect."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import zoo
from tests.train.helpers import lm_batches, params
from zoo.data.tokenizers.char import CharTokenizer
from zoo.train import LoopSettings, Outputs, Trainer, adamw
from zoo.train.lock import RunLock

TASK = zoo.tasks.LanguageModeling()


def test_the_older_trainer_keywords_make_the_same_trainer():
    loop = LoopSettings(log_every=1, eval_every=2, eval_limit=3, checkpoint_every=4, keep=5,
                        progress=False, loggers=())  # fmt: skip
    new = Trainer(TASK, adamw(1e-3), loop=loop)
    with pytest.warns(DeprecationWarning, match=r"pass loop=zoo\.train\.LoopSettings\(\.\.\.\)"):
        old = Trainer(TASK, adamw(1e-3), log_every=1, eval_every=2, eval_limit=3,
                      checkpoint_every=4, keep=5, progress=False, loggers=())  # fmt: skip
    assert old.loop == new.loop == loop
    assert old.train_step is new.train_step and old.eval_step is new.eval_step
    # the attributes the trainer had before the record, still readable
    assert (old.log_every, old.eval_every, old.eval_limit) == (1, 2, 3)
    assert (old.checkpoint_every, old.keep, old.progress, old.loggers) == (4, 5, False, ())
    # an older keyword replaces that field of `loop`
    with pytest.warns(DeprecationWarning):
        mixed = Trainer(TASK, adamw(1e-3), loop=loop, keep=9)
    assert mixed.loop == LoopSettings(log_every=1, eval_every=2, eval_limit=3,
                                      checkpoint_every=4, keep=9, progress=False)  # fmt: skip
    with pytest.raises(TypeError, match="Trainer\\(\\) got an unexpected keyword argument 'every'"):
        Trainer(TASK, every=3)


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
    with pytest.raises(ValueError, match=message), pytest.warns(DeprecationWarning):
        Trainer(TASK, **fields)  # the older spelling meets the same check


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


def test_the_older_fit_keywords_write_the_same_run(tmp_path, tiny_gpt):
    trainer = Trainer(TASK, adamw(3e-3, warmup=2), loop=LoopSettings(log_every=1, progress=False))
    tokenizer = CharTokenizer("abcdefghijklmnop")
    key = jax.random.key(1)
    new, new_history = trainer.fit(
        tiny_gpt, lm_batches(), steps=2, key=key,
        outputs=Outputs(tmp_path / "new" / "checkpoints", tmp_path / "new", tokenizer=tokenizer),
    )  # fmt: skip
    with pytest.warns(DeprecationWarning, match=r"Trainer\.fit\(checkpoint_dir=, out_dir=, "):
        old, old_history = trainer.fit(tiny_gpt, lm_batches(), steps=2, key=key,
                                       checkpoint_dir=tmp_path / "old" / "checkpoints",
                                       out_dir=tmp_path / "old", tokenizer=tokenizer)  # fmt: skip
    for name, array in params(new).items():
        np.testing.assert_array_equal(params(old)[name], array, err_msg=name)
    assert old_history.losses() == new_history.losses()
    written = sorted(
        p.relative_to(tmp_path / "new").as_posix() for p in (tmp_path / "new").rglob("*")
    )
    assert written == sorted(
        p.relative_to(tmp_path / "old").as_posix() for p in (tmp_path / "old").rglob("*")
    )
    assert "checkpoints/step_00000002" in written and "zoo_tokenizer.json" in written
    with pytest.raises(TypeError, match=r"Trainer\.fit\(\) got an unexpected keyword argument"):
        trainer.fit(tiny_gpt, lm_batches(), steps=1, key=key, output_dir=tmp_path)


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
