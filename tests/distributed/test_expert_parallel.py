"""Expert parallelism on 8 forced host (CPU) devices: a mixture-of-experts GPT on the mesh
`data=2,expert=4` (each device holds a quarter of the experts and a quarter of the rows) gives
the loss and gradients of one device, and trains to the same losses.

JAX fixes its device count when it starts, so the check runs in a subprocess with `XLA_FLAGS`.
"""

from __future__ import annotations

import pytest

from tests.distributed.forced_devices import run_on_forced_devices
from zoo.distributed import abstract_mesh, sharding_table

CHECK = r"""
import json
import equinox as eqx
import jax
import numpy as np
import zoo
from jax.sharding import PartitionSpec as P
from zoo.distributed import Layout

assert jax.device_count() == 8
model = zoo.create("qwen2-moe-tiny", key=jax.random.key(0), **{"feed_forward.z_loss_coef": 1e-3})
task = zoo.tasks.LanguageModeling()
rng = np.random.default_rng(0)
tokens = rng.integers(3, 60, (24, 12)).astype(np.int32)
batch = {"tokens": tokens[:8]}

@eqx.filter_jit
def loss_and_grads(model, batch):
    def objective(m):
        stats = task.statistics(m, batch)
        return stats.loss, stats
    return eqx.filter_value_and_grad(objective, has_aux=True)(model)

(loss, _), grads = loss_and_grads(model, batch)
layout = Layout.of("data=2,expert=4")
placed = layout.place(model)
spec = placed.layers.blocks.feed_forward.experts.gate.sharding.spec
(mesh_loss, _), mesh_grads = loss_and_grads(placed, layout.place_batch(batch))
pairs = zip(jax.tree.leaves(eqx.filter(grads, eqx.is_array)),
            jax.tree.leaves(eqx.filter(mesh_grads, eqx.is_array)), strict=True)
grad_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)

def fit(mesh):
    loop = zoo.train.LoopSettings(log_every=1, progress=False)
    trainer = zoo.Trainer(task, zoo.train.adamw(1e-2, warmup=1, eps=1e-5), loop=loop, mesh=mesh)
    data = zoo.data.batches.ArrayBatches({"tokens": tokens}, 8, seed=0)
    _, history = trainer.fit(model, data, steps=3, key=jax.random.key(1))
    return history.losses()

print(json.dumps({
    "loss": float(loss), "mesh_loss": float(mesh_loss), "grad_diff": grad_diff,
    "spec": list(spec), "losses": fit(None), "mesh_losses": fit("data=2,expert=4"),
}))
"""


def test_the_expert_axis_splits_only_the_experts():
    mesh = abstract_mesh("data=2,expert=4", 8)
    import zoo

    rows = {r["name"]: r for r in sharding_table(zoo.presets.abstract("mixtral-tiny"), mesh)}
    for name in ("gate", "up", "down"):
        row = rows[f"layers.blocks.feed_forward.experts.{name}"]
        assert tuple(row["spec"]) == (None, "expert")
        assert row["bytes_per_device"] * 4 == row["bytes"]
    assert all(not any(r["spec"]) for n, r in rows.items() if ".experts." not in n)


def test_an_expert_axis_that_does_not_divide_the_experts_is_refused():
    import zoo

    with pytest.raises(ValueError, match="expert=8 splits a mixture of experts' experts"):
        sharding_table(zoo.presets.abstract("mixtral-tiny"), abstract_mesh("expert=8", 8))
    with pytest.raises(ValueError, match="the model has no experts"):
        sharding_table(zoo.presets.abstract("llama-tiny"), abstract_mesh("expert=2", 2))


@pytest.mark.slow
@pytest.mark.distributed  # the Trainer on a mesh writes sharded checkpoints (orbax-checkpoint)
def test_data_2_expert_4_equals_one_device():
    pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")
    out = run_on_forced_devices(CHECK)
    assert out["spec"] == [None, "expert"], out
    print(out)
    assert abs(out["loss"] - out["mesh_loss"]) < 1e-5
    assert out["grad_diff"] < 1e-5
    assert max(abs(a - b) for a, b in zip(out["losses"], out["mesh_losses"], strict=True)) < 1e-5
