"""On 8 devices under fsdp=8, a background save owns a host copy of every shard as soon as
`save` returns: the step that follows may donate (delete) the device buffers meanwhile."""

from __future__ import annotations

import threading

import jax
import numpy as np

import zoo
from zoo.distributed import Layout
from zoo.serialize import named_arrays
from zoo.train.checkpoint import list_checkpoints, load_checkpoint
from zoo.train.sharded import ShardedWriter


def test_saved_shards_survive_the_buffers_being_donated(tmp_path, monkeypatch):
    layout = Layout.of("fsdp=8")
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), mesh=layout.mesh)
    model = layout.place(zoo.create("gpt-tiny", key=jax.random.key(0)))
    opt_state = trainer.init_optimizer(model)
    expected = {name: np.asarray(value) for name, value in named_arrays(model).items()}
    writer = ShardedWriter(tmp_path, keep=2)
    release = threading.Event()
    real = writer._wait_for_arrays
    monkeypatch.setattr(writer, "_wait_for_arrays", lambda: (release.wait(60), real()))
    final = writer.save(step=4, model=model, opt_state=opt_state, key=jax.random.key(1))
    for array in jax.tree_util.tree_leaves((model, opt_state)):
        if isinstance(array, jax.Array):
            array.delete()  # what the next, donating, step does to them
    assert list_checkpoints(tmp_path) == []  # not yet complete
    release.set()
    writer.close()
    assert list_checkpoints(tmp_path) == [(4, final)]
    skeleton = layout.place(zoo.create("gpt-tiny", key=jax.random.key(5)))
    loaded = load_checkpoint(
        final, model=skeleton, opt_state=trainer.init_optimizer(skeleton), layout=layout
    )
    for name, value in named_arrays(loaded.model).items():
        np.testing.assert_array_equal(np.asarray(value), expected[name], err_msg=name)
    assert loaded.model.embedder.token_weight.sharding == skeleton.embedder.token_weight.sharding
