"""Training on 8 (forced CPU) devices equals training on one: losses, weights, checkpoints.

Run through tests/distributed/test_forced_devices.py. Each case trains 5 steps (batch 8,
length 16) on one device and on a mesh, from the same weights and data. Adam divides by
sqrt(v) + eps, which magnifies the float rounding of gradients that cancel to almost zero
(summed in another order on 8 devices); eps=1e-5 keeps that magnification small enough to see
the sharding itself within 1e-5. ZOO_FORCED_ALL=1 runs every flavor on every mesh.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zoo
from zoo.data.batches import ArrayBatches
from zoo.distributed import make_mesh, sharding_table
from zoo.serialize import named_arrays

STEPS, BATCH, SEQ = 5, 8, 16
CUBE = "data=2,fsdp=2,tensor=2"
MESHES = ("data=8", "fsdp=8", CUBE)
PRESETS = ("gpt-tiny", "llama-tiny", "classifier-tiny", "translator-tiny")
# each axis alone on the GPT, all three at once on every flavor (Llama: GQA heads over tensor);
# each case compiles a step, which is most of the time
CASES = [("gpt-tiny", mesh) for mesh in MESHES] + [
    (preset, CUBE) for preset in ("llama-tiny", "classifier-tiny", "translator-tiny")
]
if os.environ.get("ZOO_FORCED_ALL"):
    CASES = [(preset, mesh) for preset in PRESETS for mesh in MESHES]


def batches(flavor: str) -> ArrayBatches:
    rng = np.random.default_rng(0)

    def tokens():
        return rng.integers(3, 60, (3 * BATCH, SEQ)).astype(np.int32)

    if flavor == "classifier":
        arrays = {"tokens": tokens(), "labels": rng.integers(0, 2, 3 * BATCH).astype(np.int32)}
    elif flavor == "translator":
        arrays = {"src": tokens(), "tgt": tokens()}
    else:
        arrays = {"tokens": tokens()}
    return ArrayBatches(arrays, BATCH, seed=0)


@functools.cache
def initial(preset: str) -> Any:
    return zoo.create(preset, key=jax.random.key(0))


def trainer_for(flavor: str, mesh: str | None, **loop) -> zoo.Trainer:
    optimizer = zoo.train.adamw(1e-2, warmup=1, eps=1e-5)
    task = zoo.tasks.for_flavor(flavor)
    settings = zoo.train.LoopSettings(log_every=1, progress=False, **loop)
    return zoo.Trainer(task, optimizer, loop=settings, mesh=mesh)


@dataclass
class Run:
    losses: dict[int, float]  # step -> training loss
    params: dict[str, np.ndarray]
    model: Any


def train(preset: str, mesh: str | None, checkpoint_dir=None, resume: bool = False) -> Run:
    model = initial(preset)
    flavor = zoo.models.flavor_of(model)
    checkpoint_every = None if checkpoint_dir is None else 3
    trainer = trainer_for(flavor, mesh, checkpoint_every=checkpoint_every)
    out, history = trainer.fit(
        model,
        batches(flavor),
        steps=STEPS,
        key=jax.random.key(1),
        outputs=zoo.train.Outputs(checkpoint_dir),
        resume=resume,
    )
    losses = {row["step"]: row["loss"] for row in history.rows if row["split"] == "train"}
    return Run(losses, {k: np.asarray(v) for k, v in named_arrays(out).items()}, out)


baseline = functools.cache(lambda preset: train(preset, None))


def assert_same_training(run: Run, reference: Run, steps) -> None:
    np.testing.assert_allclose(
        [run.losses[s] for s in steps], [reference.losses[s] for s in steps], rtol=0, atol=1e-5
    )
    assert run.params.keys() == reference.params.keys()
    for name, value in reference.params.items():
        np.testing.assert_allclose(run.params[name], value, rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("preset", "mesh"), CASES)
def test_mesh_training_equals_one_device(preset, mesh):
    assert_same_training(train(preset, mesh), baseline(preset), range(1, STEPS + 1))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """gpt-tiny under fsdp=8 with checkpoints at steps 3 and 5 (in `directory`)."""
    directory = tmp_path_factory.mktemp("fsdp") / "checkpoints"
    return directory, train("gpt-tiny", "fsdp=8", checkpoint_dir=directory)


def test_fsdp8_keeps_an_eighth_of_weights_and_optimizer_on_each_device(fsdp_run):
    _, run = fsdp_run
    hidden = run.model.layers.blocks.feed_forward.hidden.weight
    assert hidden.sharding.spec == P(None, None, "fsdp")  # kept through the steps
    assert hidden.addressable_shards[0].data.shape == (2, 256, 8)
    state = trainer_for("gpt", "fsdp=8").init_optimizer(run.model)
    arrays = jax.tree_util.tree_leaves(eqx.filter((run.model, state), eqx.is_array))
    total = sum(array.nbytes for array in arrays)
    held = {device: 0 for device in jax.devices()}
    for array in arrays:
        for shard in array.addressable_shards:
            held[shard.device] += shard.data.nbytes
    assert len(set(held.values())) == 1  # every device holds the same
    per_device = next(iter(held.values()))
    planned = sharding_table((run.model, state), make_mesh("fsdp=8"))
    assert per_device == sum(row["bytes_per_device"] for row in planned)
    # weights and Adam's two moments: an eighth of each array, except those fsdp keeps whole
    # (the query/key/value and hidden biases, Adam's step counts), so a little over an eighth
    assert total // 8 <= per_device < 0.14 * total


@pytest.mark.parametrize("mesh", ["data=2,tensor=4", None])
def test_fsdp8_checkpoint_resumes_on_another_mesh_or_one_device(fsdp_run, mesh, tmp_path):
    directory, _ = fsdp_run
    saved = directory / "step_00000003"
    assert (saved / "arrays").is_dir() and not (saved / "model.safetensors").exists()
    copy = tmp_path / "checkpoints"
    shutil.copytree(directory, copy)
    shutil.rmtree(copy / "step_00000005")
    resumed = train("gpt-tiny", mesh, checkpoint_dir=copy, resume=True)
    assert_same_training(resumed, baseline("gpt-tiny"), (4, 5))
    assert zoo.load(copy).config == initial("gpt-tiny").config  # consolidated model.safetensors


def test_a_checkpoint_of_another_model_is_refused(fsdp_run, tmp_path):
    directory, _ = fsdp_run
    shutil.copytree(directory, tmp_path / "checkpoints")
    with pytest.raises(ValueError, match="holds a gpt whose config differs from this gpt's in"):
        train("llama-tiny", "fsdp=8", checkpoint_dir=tmp_path / "checkpoints", resume=True)


def test_bad_meshes_and_batches_are_refused_before_training():
    with pytest.raises(ValueError, match="num_kv_heads=2 is not divisible by 4; choose tensor"):
        train("llama-tiny", "data=2,tensor=4")
    trainer = trainer_for("gpt", "fsdp=8")
    twelve = ArrayBatches({"tokens": np.full((24, SEQ), 5, np.int32)}, 12)
    with pytest.raises(ValueError, match="batch size 12 does not split over the mesh "
                       "data=1,fsdp=8,tensor=1: its data x fsdp axes take 8 slices of rows; "
                       "choose a batch size that is a multiple of 8"):  # fmt: skip
        trainer.fit(initial("gpt-tiny"), twelve, steps=1, key=jax.random.key(1))
    with pytest.raises(ValueError, match="needs 6 devices but there are 8 cpu devices"):
        trainer_for("gpt", "data=3,fsdp=2")
