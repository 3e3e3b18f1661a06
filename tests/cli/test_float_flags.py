"""Every float flag of every `zoo` command reads its value through `zoo.cli._numbers.Real`: NaN,
±inf and values outside the flag's range are refused when the flags are parsed, naming the
range (NaN passed every `<` test, and `--beta inf` passed `beta > 0`)."""

from __future__ import annotations

import argparse

import pytest

from zoo.cli import build_parser, main
from zoo.cli._numbers import Real


def float_flags() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every option whose values are numbers with a fraction."""
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    found = []
    for name, parser in commands.choices.items():
        for action in parser._actions:
            if action.type is float or isinstance(action.type, Real):
                found.append((name, action))
    return found


def test_every_float_flag_reads_through_one_type():
    flags = float_flags()
    named = {(command, action.option_strings[0]) for command, action in flags}
    assert {("train", "--lr"), ("train", "--beta"), ("eval", "--beta"), ("generate", "--top-p"),
            ("chat", "--temperature"), ("translate", "--length-penalty"),
            ("bench", "--dropout"), ("train", "--holdout")} <= named  # fmt: skip
    plain = [f"zoo {command} {action.option_strings[0]}" for command, action in flags
             if action.type is float]  # fmt: skip
    assert plain == []  # `type=float` takes nan and inf


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_every_float_flag_refuses_non_finite_values_naming_its_range(text):
    for command, action in float_flags():
        assert isinstance(action.type, Real)
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            action.type(text)
        assert str(refused.value).startswith(f"{text} is not a finite number"), command
        assert action.type.range in str(refused.value)


def test_ranges_hold_their_bounds():
    closed, half_open = Real(low=0.0), Real(low=0.0, high=0.5, high_open=True)
    assert (closed.range, half_open.range) == (">= 0", "in [0, 0.5)")
    assert closed("0") == 0.0 and half_open("0.4999") == 0.4999
    for refused, text in ((closed, "-1e-9"), (half_open, "0.5")):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a finite number"):
            refused(text)
    with pytest.raises(argparse.ArgumentTypeError, match="'lots' is not a finite number >= 0"):
        closed("lots")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "gpt", "--objective", "dpo", "--beta", "inf"],
         "argument --beta: inf is not a finite number > 0"),
        (["train", "gpt", "--lr", "nan"], "argument --lr: nan is not a finite number > 0"),
        (["train", "gpt", "--dpo-label-smoothing", "0.5"],
         "argument --dpo-label-smoothing: 0.5 is not a finite number in [0, 0.5)"),
        (["generate", "m", "x", "--top-p", "inf"],
         "argument --top-p: inf is not a finite number in (0, 1]"),
        (["translate", "m", "x", "--length-penalty", "nan"],
         "argument --length-penalty: nan is not a finite number"),
    ],
)  # fmt: skip
def test_a_non_finite_flag_stops_the_command_line_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--data", "synthetic:addition"] if argv[0] == "train" else argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_a_config_files_non_finite_number_is_refused_as_the_flag_refuses_it(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("objective: dpo\nbeta: .inf\nlr: .nan\nweight_decay: -1\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["train", "gpt", "--config", str(config), "--data", "synthetic:addition"])
    err = capsys.readouterr().err
    assert f"--config {config}: beta: inf is not a finite number > 0" in err
    assert f"--config {config}: lr: nan is not a finite number > 0" in err  # every one at once
    assert f"--config {config}: weight_decay: -1 is not a finite number >= 0" in err
