"""Two processes of 4 (forced CPU) devices each train as one process of 8: `zoo train` with
`--coordinator`, the same mesh over the 8 devices, the same losses and weights, only process 0
writing the run's files; and two processes `--resume` the run as one process would go on.

Each process runs `python -m zoo train` under an audit hook that records the files it creates,
writes, renames or deletes in the run directory (`tests/distributed/launch.py`); process 1 may
touch only its own shards in a checkpoint's orbax `arrays/` folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.launch import (
    file_events,
    finish,
    in_shards,
    joined,
    last_json,
    silent,
    start,
)

pytestmark = pytest.mark.distributed
pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")

MESH = "data=2,fsdp=4"
# inverse_sqrt with warmup 1 does not depend on --steps: a run of 4 steps resumed to 6 follows
# the learning rates of a run of 6
TRAIN = ["train", "gpt", "--preset", "gpt-tiny", "--data", "synthetic:addition",
         "--batch-size", "8", "--warmup", "1", "--log-every", "1", "--checkpoint-every", "2",
         "--eval-limit", "1", "--mesh", MESH, "--no-progress", "--json"]  # fmt: skip


def logged(out: Path, split: str) -> list[tuple[int, float]]:
    """(step, loss) of each row of `split` in the run's metrics.jsonl, in order."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows if row["split"] == split]


def metrics(out: Path, split: str) -> dict[int, float]:
    return dict(logged(out, split))


def weights(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(out / "model.safetensors"))


def checkpoint_weights(checkpoint: Path) -> dict[str, np.ndarray]:
    """The model arrays of a mesh checkpoint (orbax), read onto this process's one device."""
    from zoo.train.sharded import load_arrays

    return {name: np.asarray(value) for name, value in load_arrays(checkpoint)["model"].items()}


def assert_close(found: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(found[name], value, rtol=0, atol=1e-5, err_msg=name)


def two_processes(out: Path, logs: list[Path], *argv: str) -> list:
    options = joined()
    return [
        start(out, logs[i], 4, [*TRAIN, *argv, "--out", str(out), *options, "--process-id", str(i)])
        for i in range(2)
    ]


@pytest.mark.slow
def test_two_processes_train_and_resume_as_one_and_only_process_0_writes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    logs = [tmp_path / f"files{i}.json" for i in range(5)]
    # one process of 8 devices trains 6 steps uninterrupted; two processes train 4 ...
    processes = [start(one, logs[0], 8, [*TRAIN, "--steps", "6", "--out", str(one)])]
    processes += two_processes(two, logs[1:3], "--steps", "4")
    outputs = finish(processes)
    first, second = file_events(logs[1]), file_events(logs[2])

    assert metrics(two, "train").keys() == {1, 2, 3, 4}
    np.testing.assert_allclose(
        list(metrics(two, "train").values()), [metrics(one, "train")[s] for s in range(1, 5)],
        rtol=0, atol=1e-5,
    )  # fmt: skip
    at_step_4 = weights(two)
    assert_close(at_step_4, checkpoint_weights(one / "checkpoints" / "step_00000004"))

    # process 0 reports and writes everything; process 1 only its shards of the checkpoints
    assert last_json(outputs[1])["steps"] == 4
    assert silent(outputs[2])
    written = {path for _, path in first}
    for name in ("metrics.jsonl", "train_args.json", "config.json", "zoo_tokenizer.json",
                 ".zoo-train.lock", "model.safetensors", "checkpoints/.step_00000002.partial/state.json"):  # fmt: skip
        assert name in written, sorted(written)
    assert ["os.rename", "checkpoints/step_00000004"] in first  # published by process 0
    assert second and all(in_shards(path) for _, path in second), second
    assert (two / ".zoo-train.lock").read_text().strip() == str(processes[1].pid)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [
        ".zoo-train.lock", "step_00000002", "step_00000004"
    ]  # fmt: skip

    # ... then two processes resume theirs to step 6: the losses and weights of the run of 6
    resumed = two_processes(two, logs[3:5], "--steps", "6", "--resume")
    outputs = finish(resumed)
    first, second = file_events(logs[3]), file_events(logs[4])

    summary = last_json(outputs[0])
    assert (summary["steps"], summary["resumed_from"]) == (6, 4)
    assert silent(outputs[1])
    assert [step for step, _ in logged(two, "train")] == [1, 2, 3, 4, 5, 6]  # 5, 6 appended
    train = metrics(two, "train")
    np.testing.assert_allclose(
        [train[5], train[6]], [metrics(one, "train")[5], metrics(one, "train")[6]],
        rtol=0, atol=1e-5,
    )  # fmt: skip
    assert [step for step, _ in logged(two, "eval")] == [4, 6]
    np.testing.assert_allclose(metrics(two, "eval")[6], metrics(one, "eval")[6], rtol=0, atol=1e-5)
    assert_close(weights(two), weights(one))
    assert ["os.rename", "checkpoints/step_00000006"] in first
    assert "model.safetensors" in {path for _, path in first}
    assert second and all(in_shards(path) for _, path in second), second
    assert (two / ".zoo-train.lock").read_text().strip() == str(resumed[0].pid)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [
        ".zoo-train.lock", "step_00000002", "step_00000004", "step_00000006"
    ]  # fmt: skip
