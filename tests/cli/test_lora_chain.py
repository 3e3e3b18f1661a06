"""`zoo train gpt --init LORA_RUN --lora SPEC --objective dpo`: the run's adapters train further
(`--lora-init continue`, the default) or new ones start over its merged base (`merge`), and
either way the reference is the `--init` model: the same numbers as the route through
`zoo export --hf` and `--init EXPORT --reference EXPORT`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.cli.conftest import write_jsonl
from tests.cli.test_preference_cli import sums
from zoo.cli import main

LORA = ["--lora", "rank=4,alpha=8,targets=attention"]
ARGS = ["train", "gpt", "--objective", "dpo", "--beta", "0.5", "--batch-size", "8", "--lr",
        "3e-2", "--warmup", "1", "--log-every", "1", "--eval-every", "1000", "--no-progress",
        "--json", "--steps", "3"]  # fmt: skip
METRICS = ("rewards/margins", "rewards/chosen", "logps/chosen", "logps/rejected")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Pairs, a first LoRA run on them (the "SFT" run), and its HF export (merged)."""
    root = tmp_path_factory.mktemp("chain")
    pairs = root / "pairs"
    write_jsonl(pairs, "train", sums(48, seed=0))
    write_jsonl(pairs, "validation", sums(8, seed=1))
    first = root / "first"
    data = ["--data", f"json:{pairs}"]
    assert main([*ARGS, *data, "--preset", "gpt-tiny", "--tokenizer", "char", *LORA,
                 "--out", str(first)]) == 0  # fmt: skip
    export = root / "export"
    assert main(["export", str(first), "--hf", str(export), "--no-tokenizer"]) == 0
    return {"root": root, "data": data, "first": first, "export": export}


def train(runs, name: str, *extra: str) -> list[dict]:
    out = runs["root"] / name
    assert main([*ARGS, *runs["data"], *extra, "--out", str(out)]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == "train"]


def assert_same_rows(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right) == 3
    for one, other in zip(left, right, strict=True):
        assert one["loss"] == pytest.approx(other["loss"], abs=1e-5)
        for name in METRICS:
            assert one["metrics"][name] == pytest.approx(other["metrics"][name], abs=1e-5)


def exported_route(runs, name: str) -> list[dict]:
    export = str(runs["export"])
    return train(runs, name, "--init", export, "--reference", export, "--tokenizer", "char", *LORA)


def test_merge_equals_the_export_route(runs, capsys):
    chained = train(runs, "merged", "--init", str(runs["first"]), *LORA, "--lora-init", "merge")
    assert "merged into the base, new adapters start on top" in capsys.readouterr().err
    exported = exported_route(runs, "exported")
    assert_same_rows(chained, exported)
    assert chained[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
    assert chained[-1]["metrics"]["rewards/margins"] != 0.0
    # the trained adapters too
    left = load_file(runs["root"] / "merged" / "adapter" / "adapter_model.safetensors")
    right = load_file(runs["root"] / "exported" / "adapter" / "adapter_model.safetensors")
    assert left.keys() == right.keys()
    for key in left:
        np.testing.assert_allclose(left[key], right[key], rtol=0, atol=1e-5)


def test_continue_trains_the_same_adapters_against_the_init_model(runs, capsys):
    init = str(runs["first"])
    continued = train(runs, "continued", "--init", init, *LORA)
    err = capsys.readouterr().err
    assert "they train further (--lora-init continue" in err
    assert "reference: the --init model (its LoRA adapters at their starting values)" in err
    # the reference named outright, as the export: the same numbers, step by step
    named = train(runs, "named", "--init", init, *LORA, "--reference", str(runs["export"]))
    assert_same_rows(continued, named)
    assert continued[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert continued[-1]["metrics"]["rewards/margins"] != 0.0
    # stopped after step 2 and resumed: the same steps (the --init model rebuilt the same way)
    init_args = ["--init", init, *LORA, "--checkpoint-every", "1"]
    train(runs, "resumed", *init_args, "--steps", "2")
    resumed = train(runs, "resumed", *init_args, "--resume")
    assert_same_rows(resumed, continued)
    # the adapters went on from the first run's values: the same arrays, moved
    first = load_file(runs["first"] / "adapter" / "adapter_model.safetensors")
    after = load_file(runs["root"] / "continued" / "adapter" / "adapter_model.safetensors")
    assert first.keys() == after.keys()
    moved = max(float(np.abs(after[key] - first[key]).max()) for key in first)
    assert 0 < moved < 1.0


def test_continue_refuses_another_spec_and_lora_init_needs_lora(runs, capsys):
    init = str(runs["first"])
    out = str(runs["root"] / "refused")
    code = main([*ARGS, *runs["data"], "--init", init, "--lora", "rank=8", "--out", out])
    assert code != 0
    err = capsys.readouterr().err
    assert "rank 4, alpha 8 on 4 projections" in err and "--lora-init merge" in err
    assert "Traceback" not in err
    assert main([*ARGS, *runs["data"], "--init", init, "--lora-init", "merge", "--out", out]) != 0
    assert "use it with --lora" in capsys.readouterr().err
    export = str(runs["export"])  # a plain model: nothing to continue or merge
    assert main([*ARGS, *runs["data"], "--init", export, "--tokenizer", "char", *LORA,
                 "--lora-init", "continue", "--out", out]) != 0  # fmt: skip
    assert f"--init {export} has none: drop --lora-init" in capsys.readouterr().err
