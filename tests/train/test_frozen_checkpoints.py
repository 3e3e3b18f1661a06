"""A run that trains part of its model checkpoints the trained arrays only: the frozen rest is
rebuilt on resume, recognised by its fingerprint, and the run goes on bit for bit."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import safetensors.numpy

import zoo
from tests.train.helpers import lm_batches, params
from zoo.train import LoopSettings, Outputs, Trainer, adamw
from zoo.train.checkpoint_folder import STATE_FILE
from zoo.train.freeze import freeze
from zoo.train.frozen import FROZEN, fingerprint, frozen_arrays
from zoo.tree import named_arrays

LOOP = LoopSettings(log_every=1, checkpoint_every=2, progress=False)


def adapted(seed: int = 0):
    base = zoo.create("gpt-tiny", key=jax.random.key(seed))
    return zoo.lora.apply(base, rank=2, targets="attention", key=jax.random.key(7))


def lora_trainer() -> Trainer:
    optimizer = zoo.lora.only_adapters(adamw(3e-3, warmup=1))
    return Trainer(zoo.tasks.LanguageModeling(), optimizer, loop=LOOP)


def test_a_lora_checkpoint_holds_the_adapters_and_resumes_bit_for_bit(tmp_path):
    trainer, model, data, key = lora_trainer(), adapted(), lm_batches(), jax.random.key(1)
    straight, _ = trainer.fit(model, data, steps=4, key=key, outputs=Outputs(tmp_path / "full"))
    run = tmp_path / "run"
    trainer.fit(model, data, steps=2, key=key, outputs=Outputs(run))
    folder = run / "step_00000002"
    saved = safetensors.numpy.load_file(folder / "model.safetensors")
    every = named_arrays(model)
    assert sorted(saved) == sorted(name for name in every if ".lora_" in name)
    state = json.loads((folder / STATE_FILE).read_text())
    assert sorted(state[FROZEN]["names"]) == sorted(set(every) - set(saved))
    assert state[FROZEN]["fingerprint"] == fingerprint(every, tuple(state[FROZEN]["names"]))
    resumed, history = trainer.fit(model, data, steps=4, key=key, outputs=Outputs(run), resume=True)
    assert history.summary["resumed_from"] == 2
    assert jax.tree.all(jax.tree.map(np.array_equal, params(resumed), params(straight)))


def test_resume_onto_another_base_is_refused(tmp_path):
    trainer, data, key = lora_trainer(), lm_batches(), jax.random.key(1)
    trainer.fit(adapted(0), data, steps=2, key=key, outputs=Outputs(tmp_path))
    with pytest.raises(ValueError, match="holds the trained arrays only, and this run's frozen"):
        trainer.fit(adapted(1), data, steps=4, key=key, outputs=Outputs(tmp_path), resume=True)


def test_a_frozen_layer_is_left_out_of_the_checkpoint(tmp_path, tiny_gpt):
    optimizer = freeze(adamw(3e-3, warmup=1), "embeddings,layers:0")
    trainer, data, key = (
        Trainer(zoo.tasks.LanguageModeling(), optimizer, loop=LOOP),
        lm_batches(),
        jax.random.key(1),
    )
    straight, _ = trainer.fit(tiny_gpt, data, steps=4, key=key, outputs=Outputs(tmp_path / "full"))
    run = tmp_path / "run"
    trainer.fit(tiny_gpt, data, steps=2, key=key, outputs=Outputs(run))
    saved = safetensors.numpy.load_file(run / "step_00000002" / "model.safetensors")
    assert "embedder.token_weight" not in saved and saved
    resumed, _ = trainer.fit(tiny_gpt, data, steps=4, key=key, outputs=Outputs(run), resume=True)
    assert jax.tree.all(jax.tree.map(np.array_equal, params(resumed), params(straight)))


def test_the_fingerprint_sees_a_changed_element_and_not_the_device():
    model = adapted()
    frozen = frozen_arrays(zoo.lora.only_adapters(adamw(1e-3)), model)
    assert frozen is not None and "embedder.token_weight" in frozen.names
    arrays = named_arrays(model)
    on_host = {name: np.asarray(array) for name, array in arrays.items()}
    assert fingerprint(on_host, frozen.names) == frozen.fingerprint
    changed = dict(on_host)
    changed["embedder.token_weight"] = on_host["embedder.token_weight"].copy()
    changed["embedder.token_weight"].reshape(-1)[0] += 1.0  # the first element is sampled
    assert fingerprint(changed, frozen.names) != frozen.fingerprint
    # an optimizer that trains every array freezes nothing: full checkpoints as before
    assert frozen_arrays(adamw(1e-3), model) is None
