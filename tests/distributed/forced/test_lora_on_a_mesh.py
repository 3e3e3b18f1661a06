"""LoRA adapters train on a mesh as on one device: the same losses, and the base unchanged."""

from __future__ import annotations

import jax
import numpy as np

import zoo
from tests.distributed.forced.test_sharded_training import CUBE, STEPS, batches
from zoo.serialize import named_arrays


def adapted_run(mesh: str | None) -> tuple[list[float], dict[str, np.ndarray]]:
    base = zoo.create("llama-tiny", key=jax.random.key(0))
    model = zoo.lora.apply(base, rank=4, alpha=8, targets="all-linear", key=jax.random.key(2))
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(1e-2, warmup=1, eps=1e-5))
    loop = zoo.train.LoopSettings(log_every=1, progress=False)
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), optimizer, loop=loop, mesh=mesh)
    out, history = trainer.fit(model, batches("gpt"), steps=STEPS, key=jax.random.key(1))
    losses = [row["loss"] for row in history.rows if row["split"] == "train"]
    return losses, {k: np.asarray(v) for k, v in named_arrays(out).items()}


def test_lora_on_a_mesh_equals_one_device_and_keeps_the_base():
    one_losses, one = adapted_run(None)
    mesh_losses, many = adapted_run(CUBE)
    np.testing.assert_allclose(mesh_losses, one_losses, rtol=0, atol=1e-5)
    assert one.keys() == many.keys()
    start = {
        k: np.asarray(v)
        for k, v in named_arrays(
            zoo.lora.apply(
                zoo.create("llama-tiny", key=jax.random.key(0)),
                rank=4,
                alpha=8,
                targets="all-linear",
                key=jax.random.key(2),
            )
        ).items()
    }
    for name, value in one.items():
        np.testing.assert_allclose(many[name], value, rtol=0, atol=1e-5, err_msg=name)
        if "lora_" not in name:  # the base is frozen: bit for bit the starting weights
            np.testing.assert_array_equal(many[name], start[name], err_msg=name)
    assert any(not np.array_equal(one[k], start[k]) for k in one if "lora_b" in k)
