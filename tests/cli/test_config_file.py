"""`zoo train --config FILE`: flags from a YAML or JSON file (long names, dashes or
underscores), the command line winning, unknown keys refused with the closest flag; a run
records its resolved config (`train_config.yaml`), which reruns it bit for bit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import write_jsonl
from tests.cli.test_chat_train_cli import review_chats
from zoo.cli import build_parser, main


def parsed(*argv: str) -> dict:
    values = vars(build_parser().parse_args(["train", "gpt", *argv]))
    return {name: value for name, value in values.items() if name not in ("run", "config")}


def test_a_config_file_gives_the_flags_it_names_and_the_command_line_wins(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "preset: llama-tiny\ndata: [json:a, json:b:0.3]\nbatch-size: 10\nlr: 1e-3\n"
        "no_progress: true\npack: false\nset: [d_model=32]\nrole: [human=user]\n"
        "train-on: last\nout: runs/a\n",
        encoding="utf-8",
    )
    flags = ["--preset", "llama-tiny", "--data", "json:a", "--data", "json:b:0.3",
             "--batch-size", "10", "--lr", "1e-3", "--no-progress", "--no-pack",
             "--set", "d_model=32", "--role", "human=user", "--train-on", "last"]  # fmt: skip
    assert parsed("--config", str(config)) == parsed(*flags, "--out", "runs/a")
    # the command line wins; a repeated flag replaces the file's list whole
    won = parsed("--config", str(config), "--lr", "0.5", "--data", "json:c", "--pack", "--out",
                 "runs/b")  # fmt: skip
    assert (won["lr"], won["data"], won["pack"], won["out"]) == (0.5, "json:c", True, "runs/b")
    assert won["batch_size"] == 10
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps(yaml.safe_load(config.read_text())), encoding="utf-8")
    assert parsed("--config", str(as_json)) == parsed("--config", str(config))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "batchsize: 4\n",
            "unknown key 'batchsize', which names no flag of zoo train; the "
            "closest flag is --batch-size",
        ),
        ("steps: many\n", "steps: 'many' is not valid"),
        ("schedule: wavy\n", "schedule: 'wavy' is not one of inverse_sqrt, cosine, constant"),
        ("pack: maybe\n", "pack is a switch: give true or false"),
        ("- steps\n", "holds a list; it should map flag names to values"),
    ],
)
def test_a_bad_config_key_or_value_is_refused_naming_it(text, message, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as stopped:  # as argparse refuses a bad flag
        main(["train", "gpt", "--config", str(config), "--data", "synthetic:rot13",
              "--out", str(tmp_path / "r")])  # fmt: skip
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"--config {config}" in err and message in err


def test_without_data_or_out_the_run_is_refused_naming_the_flag(tmp_path, capsys):
    assert main(["train", "gpt", "--data", "synthetic:rot13"]) == 2
    assert "--out is required: give it on the command line" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="needs jinja2 (zoo[chat])")
def test_the_recorded_config_reruns_the_run_bit_for_bit(tmp_path, capsys):
    folder = tmp_path / "chats"
    write_jsonl(folder, "train", review_chats(40, seed=0))
    template = tmp_path / "t.jinja"
    from zoo.data.chat.template import DEFAULT_TEMPLATE

    template.write_text(DEFAULT_TEMPLATE.replace("':\\n'", "' says:\\n'"), encoding="utf-8")
    first = tmp_path / "first"
    flags = ["train", "gpt", "--preset", "llama-tiny", "--data", f"json:{folder}", "--tokenizer",
             "word", "--min-freq", "2", "--lowercase", "--max-len", "32", "--batch-size", "4",
             "--steps", "3", "--train-on", "all", "--no-pack", "--template", str(template),
             "--set", "d_model=32", "--seed", "3", "--no-progress", "--json"]  # fmt: skip
    assert main([*flags, "--out", str(first)]) == 0
    original = json.loads(capsys.readouterr().out)
    recorded = yaml.safe_load((first / "train_config.yaml").read_text())
    assert recorded["train_on"] == "all" and recorded["pack"] is False
    assert recorded["template"] == str(template.resolve())
    assert recorded["data"] == [f"json:{folder.resolve()}"] and recorded["min_freq"] == 2
    assert recorded["lr"] is not None and recorded["warmup"] is not None  # the preset's, filled
    again = tmp_path / "again"
    assert main(["train", "gpt", "--config", str(first / "train_config.yaml"),
                 "--out", str(again)]) == 0  # fmt: skip
    rerun = json.loads(capsys.readouterr().out)
    assert rerun["train_loss"] == original["train_loss"]  # bit for bit
    assert rerun["eval_loss"] == original["eval_loss"]
    assert Path(again / "chat_template.jinja").read_text() == template.read_text()
    assert json.loads((first / "train_args.json").read_text())["train_on"] == "all"


def refusal(config: Path, capsys) -> str:
    """The error `zoo train --config config` stops with (argparse's status 2)."""
    with pytest.raises(SystemExit) as stopped:
        main(["train", "gpt", "--config", str(config), "--data", "synthetic:addition"])
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("run.json", '{"steps": 3, "lr": 0.001, "lr": 5.0}',
         "the key 'lr' is given twice, as 0.001 and 5.0: keep one"),
        ("run.yaml", "lr: 0.001\nsteps: 3\nlr: 5.0\n",
         "the key 'lr' is given twice, as 0.001 (line 1) and 5.0 (line 3): keep one"),
        ("run.json", '{"set": ["d_model=32"], "x": {"a": 1, "a": 2}}',
         "the key 'a' is given twice, as 1 and 2"),
        ("run.yaml", "data:\n  - json:a\nset: [d_model=32]\ndata: json:b\n",
         "the key 'data' is given twice, as a list (line 2) and json:b (line 4)"),
    ],
)  # fmt: skip
def test_a_key_given_twice_is_refused_naming_it_and_both_values(name, text, message, tmp_path,
                                                                capsys):  # fmt: skip
    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    assert f"--config {config}: {message}" in refusal(config, capsys)


def test_a_yaml_merge_may_give_a_key_again(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("common: &common {lr: 0.5, steps: 3}\n", encoding="utf-8")
    from zoo.cli._config_load import load_config_file

    config.write_text("a: &a {lr: 0.5, steps: 3}\nb:\n  <<: *a\n  lr: 0.1\n", encoding="utf-8")
    assert load_config_file(str(config))["b"] == {"lr": 0.1, "steps": 3}


def test_a_config_file_is_bounded_and_named_when_it_is_no_config(tmp_path, capsys):
    from zoo.cli._config_load import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("steps: 3\n" + "#" * MAX_CONFIG_BYTES, encoding="utf-8")
    assert f"--config {big} is over 1 MiB, the most a run config may hold" in refusal(big, capsys)
    folder = tmp_path / "run.yaml"
    folder.mkdir()
    assert f"--config {folder} is a folder, expected a .json/.yaml file" in refusal(folder, capsys)
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(b"steps: 3\n\x89PNG\r\n\x1a\n\xff")
    err = refusal(binary, capsys)
    assert f"--config {binary} is not UTF-8 text (byte 0x89 at offset 9)" in err
    assert "Traceback" not in err
    at_bound = tmp_path / "at_bound.yaml"
    at_bound.write_text("steps: 3\n" + "#" * (MAX_CONFIG_BYTES - 9), encoding="utf-8")
    assert parsed("--config", str(at_bound))["steps"] == 3  # the bound itself is read


def test_anchors_nested_many_times_stay_one_object_and_are_refused_at_once(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    config = tmp_path / "laughs.yaml"
    config.write_text("\n".join([*lines, "set: *a9"]) + "\n", encoding="utf-8")
    err = refusal(config, capsys)  # 9**10 items if expanded
    assert "unknown key 'a0'" in err and "unknown key 'a9'" in err
    assert "set takes one value, got list" in err
