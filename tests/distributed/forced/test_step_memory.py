"""Under fsdp=8 the compiled train step takes about an eighth of one device's argument bytes.

Run through tests/distributed/test_forced_devices.py. XLA's `memory_analysis()` of the step the
Trainer runs (lowered with the sharded model, optimizer state and batch), against the same step
on one device, and against the bytes per device that the partition rules plan.
"""

from __future__ import annotations

import equinox as eqx
import jax

from tests.distributed.forced.test_sharded_training import batches, initial, trainer_for
from zoo.distributed import make_mesh, sharding_table


def compiled_step(mesh: str | None):
    """The memory analysis of the Trainer's compiled step, the model and optimizer state it
    takes (placed as `fit` places them) and the batch's bytes."""
    trainer = trainer_for("gpt", mesh)
    model, batch = initial("gpt-tiny"), batches("gpt").batch(0)
    if trainer.layout is not None:
        model, batch = trainer.layout.place(model), trainer.layout.place_batch(batch)
    state = trainer.init_optimizer(model)
    # the step that Trainer.fit calls, lowered for these arguments
    lowered = trainer.train_step.lower(model, state, batch, jax.random.key(1), 1)
    analysis = lowered.compile().compiled.memory_analysis()
    return analysis, (model, state), batch["tokens"].nbytes


def test_fsdp8_step_takes_an_eighth_of_the_argument_bytes():
    one, (model, state), batch_bytes = compiled_step(None)
    many, placed, _ = compiled_step("fsdp=8")
    total = sum(
        leaf.nbytes for leaf in jax.tree_util.tree_leaves(eqx.filter((model, state), eqx.is_array))
    )
    planned = sum(row["bytes_per_device"] for row in sharding_table(placed, make_mesh("fsdp=8")))
    # the arguments are the weights, Adam's moments and the batch: on one device all of them,
    # under fsdp=8 the planned slice of each array plus an eighth of the batch's rows
    assert (one.argument_size_in_bytes - total) - (many.argument_size_in_bytes - planned) == (
        batch_bytes - batch_bytes // 8
    )
    # a little over an eighth: fsdp keeps whole the attention's query/key/value biases and the
    # feed-forward's hidden bias (their rules split only over tensor) and Adam's step counts
    ratio = many.argument_size_in_bytes / one.argument_size_in_bytes
    assert 1 / 8 < ratio < 0.14
    # the step's outputs (the updated model and state) are the argument buffers, donated
    assert many.alias_size_in_bytes == planned
