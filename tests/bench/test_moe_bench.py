"""`zoo bench --moe-path ragged,dense` on a mixture of experts: one row per path, and a torch
peer that is the same model (same loss on the same weights). No timing is asserted."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo.cli
from zoo import presets, tasks
from zoo.bench.suite import Workload, plan
from zoo.bench.workload import BenchSpec, make_batch

SHAPE = Workload(batch=2, seq=16, steps=2, warmup=0, decode_tokens=0)


def test_moe_paths_give_an_moe_preset_one_row_each_and_leave_the_rest_alone():
    specs = plan("cpu", preset_names=["mixtral-tiny", "gpt-tiny"], workload=SHAPE,
                 moe_paths=["ragged", "dense"])  # fmt: skip
    assert [(s.preset, s.moe_path) for s in specs] == [
        ("mixtral-tiny", "ragged"),
        ("mixtral-tiny", "dense"),
        ("gpt-tiny", None),
    ]
    assert [s.config().experts().implementation for s in specs[:2]] == ["ragged", "dense"]
    assert plan("cpu", preset_names=["olmoe-tiny"], workload=SHAPE, num_layers=1)[0].config(
    ).num_layers == 1  # fmt: skip


def test_moe_path_errors_name_the_flag():
    with pytest.raises(ValueError, match="--moe-path .* no preset of this run has experts"):
        plan("cpu", preset_names=["gpt-tiny"], workload=SHAPE, moe_paths=["dense"])
    with pytest.raises(ValueError, match="unknown --moe-path 'sparse'"):
        plan("cpu", preset_names=["mixtral-tiny"], workload=SHAPE, moe_paths=["sparse"])
    with pytest.raises(ValueError, match="preset 'gpt-tiny' has no experts"):
        BenchSpec(preset="gpt-tiny", batch=2, seq=16, moe_path="ragged")
    with pytest.raises(ValueError, match="--num-layers"):
        BenchSpec(preset="mixtral-tiny", batch=2, seq=16, num_layers=0)


@pytest.mark.hf
@pytest.mark.parametrize("preset", ["mixtral-tiny", "qwen2-moe-tiny", "olmoe-tiny"])
def test_the_peer_computes_zoo_loss_on_zoo_weights(preset):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    from zoo.bench.peer_models import PeerTask, build_peer
    from zoo.interop import to_hf

    losses = {}
    for path in ("ragged", "dense"):
        spec = BenchSpec(preset=preset, batch=2, seq=16, moe_path=path)
        config = spec.config()
        model = presets.build(config, key=jax.random.key(spec.seed))
        host_batch = make_batch(spec)
        batch = {name: jnp.asarray(value) for name, value in host_batch.items()}
        with jax.numpy_dtype_promotion("standard"):
            stats = tasks.for_flavor("gpt").statistics(model, batch, key=None)
        losses[path] = float(stats.loss)
    # the bench's peer class, strictly loaded with zoo's weights: every parameter has its twin
    peer = build_peer(config, "gpt")
    peer.load_state_dict(to_hf(model)[0], strict=True)
    task = PeerTask("gpt", config, host_batch, "cpu")
    with torch.no_grad():
        outputs = peer(**task.inputs(train=True))
        peer_loss = float(task.objective(outputs))
        cross_entropy = float(task.loss(outputs.logits))
    assert losses["ragged"] == pytest.approx(losses["dense"], rel=1e-5)
    assert peer_loss == pytest.approx(losses["ragged"], rel=1e-5)
    # the load-balancing term is in both objectives: the cross-entropy alone is less
    assert peer_loss - cross_entropy > 1e-4


@pytest.mark.slow
@pytest.mark.hf
def test_bench_rows_for_both_paths_and_the_peer(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["bench", "--preset", "mixtral-tiny", "--moe-path", "ragged,dense", "--peer", "torch"]
    argv += ["--batch", "2", "--seq", "16", "--steps", "2", "--warmup", "0", "--rounds", "1"]
    argv += ["--decode-tokens", "0", "--out", str(tmp_path)]
    assert zoo.cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "moe" in out.splitlines()[0] and "step temp" in out.splitlines()[0]
    (path,) = tmp_path.glob("bench-*.json")
    saved = json.loads(path.read_text())
    rows = saved["rows"]
    assert [(r["preset"], r["moe_path"]) for r in rows] == [
        ("mixtral-tiny", "ragged"),
        ("mixtral-tiny", "dense"),
    ]
    for row in rows:
        assert row["peer_model"] == "MixtralForCausalLM" and row["peer_params"] == row["params"]
        assert row["tokens_per_s"] > 0 and row["peer_tokens_per_s"] > 0
        assert 0 < row["train_temp_bytes"] < row["train_program_bytes"]
        assert row["num_layers"] == 2
    # the same init and data on both paths: the same loss after the same steps
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-4)
    assert np.isfinite(rows[0]["peer_loss"])
    assert "--moe-path ragged,dense" in saved["meta"]["command"]
