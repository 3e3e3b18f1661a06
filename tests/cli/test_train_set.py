"""`zoo train --set NAME=VALUE`: the config tree's spellings reach the model, a name of 0.1's flat
config is refused in one line that names where it went, and `--help` says so."""

from __future__ import annotations

import jax
import pytest

from zoo.cli import build_parser, main
from zoo.cli._build import build_model
from zoo.cli._plan import plan

TRAIN = ["train", "gpt", "--preset", "llama-tiny", "--data", "synthetic:addition", "--steps", "1"]


def _built_config(tmp_path, *settings: str):
    """The config of the model `zoo train` would train with `--set` of each of `settings`."""
    argv = [*TRAIN, "--out", str(tmp_path / "run")]
    for setting in settings:
        argv += ["--set", setting]
    decided = plan(build_parser().parse_args(argv))
    built = build_model(decided.model, decided.data, decided.data_options, jax.random.key(0))
    return built.model.config


def test_set_takes_dotted_paths_short_block_paths_aliases_and_json(tmp_path):
    config = _built_config(
        tmp_path,
        "layers.block.attention.window=8",  # a dotted path
        "attention.num_kv_heads=1",  # a short path: every block's
        "norm.eps=1e-6",
        "num_layers=1",  # aliases
        "d_ff=48",
        "head.tie=false",  # a JSON value
    )
    block = config.layers.block
    assert (block.attention.window, block.attention.num_kv_heads, block.norm.eps) == (8, 1, 1e-6)
    assert (config.num_layers, block.feed_forward.d_ff, config.head.tie) == (1, 48, False)


def test_a_flat_name_of_0_1_is_refused_naming_its_path(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TRAIN, "--out", str(out), "--set", "num_kv_heads=2"]) == 2
    err = capsys.readouterr().err
    assert (
        "zoo train: error: GPTConfig has no field 'num_kv_heads': since 0.2 the config is the "
        "tree of its parts' settings, and num_kv_heads is attention.num_kv_heads"
    ) in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("zoo train: error: GPTConfig has no field")
    assert not (out / "train_args.json").exists()


def test_a_setting_without_a_value_is_refused(tmp_path, capsys):
    assert main([*TRAIN, "--out", str(tmp_path / "run"), "--set", "attention.window"]) == 2
    assert "--set takes NAME=VALUE (e.g. --set attention.num_kv_heads=2)" in capsys.readouterr().err


def test_help_spells_set_as_the_config_tree(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--set NAME=VALUE" in shown
    for spelling in ("dotted path (layers.block.attention.window)", "attention.num_kv_heads",
                     "num_layers, num_heads, d_ff, dropout, attention_dropout, num_classes",
                     "(head.pooler={})", "e.g. --set num_layers=2 --set attention.num_kv_heads=1"):  # fmt: skip
        assert spelling in shown


@pytest.mark.parametrize("value", ["nan", "-inf"])
def test_a_non_finite_setting_is_read_as_a_number_and_refused_with_the_fields_range(
    value, tmp_path, capsys
):
    out = tmp_path / "run"
    argv = ["train", "gpt", "--preset", "mixtral-tiny", "--data", "synthetic:addition",
            "--steps", "1", "--out", str(out), "--set", f"feed_forward.aux_loss_coef={value}"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    number = float(value)
    assert (
        f"zoo train: error: aux_loss_coef={number} is not a finite number (aux_loss_coef must "
        "be >= 0)"
    ) in err
    assert "not supported between" not in err and not (out / "train_args.json").exists()
