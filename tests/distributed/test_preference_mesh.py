"""DPO on 8 forced host (CPU) devices: `zoo train gpt --objective dpo --mesh data=2,fsdp=4` logs
the losses and rewards of the same run on one device.

JAX fixes its device count when it starts, so the runs go in a subprocess with `XLA_FLAGS`.
"""

from __future__ import annotations

import pytest

from tests.distributed.forced_devices import run_on_forced_devices

CHECK = r"""
import json, sys, tempfile
from pathlib import Path
import jax
from tests.cli.conftest import write_jsonl
from tests.cli.test_preference_cli import sums
from zoo.cli import main

assert jax.device_count() == 8
work = Path(tempfile.mkdtemp())
write_jsonl(work / "pairs", "train", sums(48, seed=0))
write_jsonl(work / "pairs", "validation", sums(8, seed=1))
runs = {}
for name, extra in (("one", []), ("mesh", ["--mesh", "data=2,fsdp=4"])):
    out = work / name
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--tokenizer", "char", "--data",
            f"json:{work / 'pairs'}", "--objective", "dpo", "--beta", "0.5", "--batch-size",
            "8", "--lr", "1e-2", "--warmup", "1", "--steps", "3", "--log-every", "1",
            "--eval-every", "3", "--no-progress", "--json", "--out", str(out), *extra]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    runs[name] = [{"split": r["split"], "loss": r["loss"], **r["metrics"]} for r in rows]
print(json.dumps(runs))
"""


@pytest.mark.slow
@pytest.mark.distributed  # the Trainer on a mesh writes sharded checkpoints (orbax-checkpoint)
def test_dpo_on_data_2_fsdp_4_equals_one_device():
    pytest.importorskip("orbax.checkpoint", reason="the `distributed` extra (orbax-checkpoint)")
    runs = run_on_forced_devices(CHECK)
    one, mesh = runs["one"], runs["mesh"]
    assert [row["split"] for row in one] == ["train"] * 3 + ["eval"]
    assert [row["split"] for row in mesh] == [row["split"] for row in one]
    assert one[0]["loss"] == pytest.approx(0.6931472, abs=1e-6)  # the policy is its reference
    assert one[2]["loss"] != one[0]["loss"]
    # rewards/accuracies counts pairs whose margin is > 0: at the start every margin is 0 up to
    # the rounding of the sharded sums, so it is compared through the margins instead
    for left, right in zip(one, mesh, strict=True):
        for name in ("loss", "rewards/margins", "rewards/chosen", "logps/chosen", "logps/rejected"):
            assert right[name] == pytest.approx(left[name], abs=1e-5), (name, left, right)
