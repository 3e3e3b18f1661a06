"""Benchmark specs, device defaults and the random batches both frameworks get."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from zoo import tasks
from zoo.bench.hardware import Peak
from zoo.bench.run_zoo import ZooRun, make_forward, model_inputs
from zoo.bench.suite import Workload, attention_for, plan
from zoo.bench.workload import BenchSpec, make_batch, make_prompts
from zoo.records import get_path
from zoo.train import adamw
from zoo.train.step import make_train_step


def test_batches_have_the_task_formats_and_no_padding():
    gpt = make_batch(BenchSpec(preset="gpt-tiny", batch=3, seq=8))
    assert gpt["tokens"].shape == (3, 9) and gpt["tokens"].dtype == np.int32
    assert gpt["tokens"].min() >= 1  # gpt-tiny pads with 0
    classifier = make_batch(BenchSpec(preset="classifier-tiny", batch=3, seq=8))
    assert classifier["tokens"].shape == (3, 8) and classifier["labels"].shape == (3,)
    assert set(np.unique(classifier["labels"])) <= {0, 1}
    translator = make_batch(BenchSpec(preset="translator-tiny", batch=3, seq=8))
    assert translator["src"].shape == (3, 8) and translator["tgt"].shape == (3, 9)
    assert make_prompts(BenchSpec(preset="gpt-tiny", batch=3, seq=8, decode_prompt=5)).shape == (
        3,
        5,
    )


def test_spec_changes_the_config():
    spec = BenchSpec(preset="gpt2", batch=1, seq=8, pad_vocab=True, layers="unroll", dropout=0.1)
    config = spec.config()
    assert config.vocab_size == 50304  # 50257 rounded up to a multiple of 64
    assert config.layer_loop == "unroll"
    rates = [get_path(config, path) for name in ("dropout", "attention_dropout")
             for path in config.paths(name)]  # fmt: skip
    assert len(rates) > 2 and all(rate == 0.1 for rate in rates)
    # the data still uses the preset's own ids
    assert make_batch(spec)["tokens"].max() < 50257
    assert BenchSpec(preset="translator-tiny", batch=2, seq=8).tokens_per_step() == 2 * 2 * 8
    # remat: None keeps the preset's, "none" turns it off
    assert BenchSpec(preset="gpt-tiny", batch=1, seq=8).config().remat == "dots"
    assert BenchSpec(preset="gpt-tiny", batch=1, seq=8, remat="none").config().remat is None
    assert BenchSpec(preset="gpt2", batch=1, seq=8, remat="full").config().remat == "full"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(seq=129), "exceeds max_positions=128"),
        (dict(precision="fp16"), "precision must be one of"),
        (dict(batch=0), "batch must be >= 1"),
        (dict(layers="loop"), "layers must be one of"),
        (dict(remat="some"), "remat must be one of"),
        (dict(decode_prompt=100, decode_tokens=100), "exceed max_positions"),
    ],
)
def test_bad_specs_say_what_is_wrong(changes, message):
    with pytest.raises(ValueError, match=message):
        BenchSpec(**{"preset": "gpt-tiny", "batch": 2, "seq": 8, **changes})


def test_unknown_preset_suggests_names():
    with pytest.raises(KeyError, match="gpt-tiny"):
        BenchSpec(preset="gpt-tinyy", batch=2, seq=8)


def test_plan_uses_the_device_defaults():
    cpu = plan("cpu")
    assert [s.preset for s in cpu] == ["gpt-tiny", "classifier-tiny", "translator-tiny"]
    assert {(s.batch, s.seq, s.precision, s.attention) for s in cpu} == {(16, 64, "fp32", None)}
    gpu = plan("gpu", flavors=["gpt"])
    assert [(s.preset, s.batch, s.seq, s.precision) for s in gpu] == [("gpt2", 16, 1024, "bf16")]
    assert gpu[0].attention == "cudnn"
    # a tiny preset on a GPU keeps to its max_positions
    assert plan("gpu", preset_names=["gpt-tiny"])[0].seq == 128
    assert plan("cpu", preset_names=["gpt2"], workload=Workload(seq=32, steps=2))[0].steps == 2


def test_plan_takes_the_workload_as_one_record():
    shape = Workload(batch=4, seq=32, precision="bf16", attention="xla", decode_prompt=8,
                     decode_tokens=4, steps=2, warmup=0)  # fmt: skip
    [spec] = plan("gpu", flavors=["gpt"], workload=shape, dropout=0.1, rounds=2)
    assert (spec.batch, spec.seq, spec.precision, spec.attention) == (4, 32, "bf16", "xla")
    assert (spec.decode_prompt, spec.decode_tokens, spec.steps, spec.warmup) == (8, 4, 2, 0)
    assert (spec.dropout, spec.rounds) == (0.1, 2)
    for name in ("batch", "seq", "precision", "warmup", "batches"):
        with pytest.raises(
            TypeError, match=f"^plan\\(\\) got an unexpected keyword argument '{name}'$"
        ):
            plan("cpu", **{name: 4})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"precision": "fp16"}, "precision must be one of"),
        ({"attention": "flash"}, "attention must be one of"),
        ({"batch": 0}, "batch must be >= 1, got 0; pass a larger --batch"),
        (
            {"decode_tokens": -1},
            "decode_tokens must be >= 0, got -1; pass a larger --decode-tokens",
        ),
    ],
)
def test_a_bad_workload_is_refused_with_the_flag_to_fix(options, message):
    with pytest.raises(ValueError, match=message):
        Workload(**options)


def test_plan_refuses_a_preset_of_another_flavor():
    with pytest.raises(ValueError, match="is a classifier"):
        plan("cpu", flavors=["gpt"], preset_names=["classifier-tiny"])


def test_attention_choice():
    assert attention_for("auto", "gpu", "bf16") == "cudnn"
    assert attention_for("auto", "gpu", "fp32") is None
    assert attention_for("auto", "cpu", "bf16") is None
    assert attention_for("xla", "gpu", "bf16") == "xla"


@pytest.mark.parametrize("preset", ["gpt-tiny", "classifier-tiny", "translator-tiny"])
def test_the_timed_programs_are_the_trainers_without_a_check_inside(preset):
    """zoo bench times the program `zoo train` runs: the batch's ids are checked once on the
    host, so neither the train step nor the forward holds the in-program id check (a branch
    to a host callback on every call, which a step made without host checks holds)."""
    run = ZooRun(BenchSpec(preset=preset, batch=2, seq=8, decode_tokens=0), Peak(None, None, ""))
    model, opt_state, _ = run.train.state
    inputs = model_inputs(run.spec.flavor, run.batch)
    with jax.numpy_dtype_promotion("standard"):
        timed = run.train_step.lower(model, opt_state, run.batch, run.key, 0).as_text()
        forward = make_forward(run.spec.precision).lower(model, inputs).as_text()
        checking = make_train_step(tasks.for_flavor(run.spec.flavor), adamw(1e-4))
        inside = checking.lower(model, opt_state, run.batch, run.key, 0).as_text()
    assert "callback" in inside
    assert "callback" not in timed and "callback" not in forward
