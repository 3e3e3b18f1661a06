"""`zoo train --config` with the names of TRL's `SFTConfig` / `DPOConfig` and HF's
`TrainingArguments`: read as zoo's flags and said in one line, refused with the reason or the
nearest flag where zoo has no such option, every bad key at once."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from zoo.cli import build_parser, main
from zoo.cli._trl_names import ALIASES, NOT_OFFERED, SAME_AS_ZOO


def parsed(*argv: str) -> dict:
    values = vars(build_parser().parse_args(["train", "gpt", *argv]))
    return {name: value for name, value in values.items() if name not in ("run", "config")}


def test_trl_names_read_as_zoos_flags_and_say_so_in_one_line(tmp_path, capsys):
    config = tmp_path / "dpo.yaml"
    config.write_text(
        "model_name_or_path: runs/sft\nlearning_rate: 5.0e-7\nper_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 8\nnum_train_epochs: 2.0\nmax_length: 512\n"
        "max_prompt_length: 128\nmax_completion_length: 384\nwarmup_steps: 10\n"
        "weight_decay: 0.0\nlr_scheduler_type: cosine\nbeta: 0.1\nloss_type: sigmoid\n"
        "gradient_checkpointing: true\nseed: 42\nlogging_steps: 5\nsave_steps: 50\n"
        "save_total_limit: 2\noutput_dir: runs/dpo\nbf16: true\nreport_to: none\n"
        "optim: adamw_torch\nmax_steps: -1\nprecompute_ref_log_probs: true\n",
        encoding="utf-8",
    )
    zoo_flags = ["--init", "runs/sft", "--lr", "5e-7", "--batch-size", "32", "--accumulate", "8",
                 "--epochs", "2", "--max-len", "512", "--max-prompt-len", "128",
                 "--max-completion-len", "384", "--warmup", "10", "--weight-decay", "0",
                 "--schedule", "cosine", "--beta", "0.1", "--objective", "dpo",
                 "--gradient-checkpointing", "--seed", "42", "--log-every", "5",
                 "--checkpoint-every", "50", "--keep", "2", "--out", "runs/dpo",
                 "--precision", "bf16", "--precompute-reference"]  # fmt: skip
    assert parsed("--config", str(config)) == parsed(*zoo_flags)
    said = [line for line in capsys.readouterr().err.splitlines() if "TRL/HF names" in line]
    assert len(said) == 1
    assert "learning_rate -> --lr" in said[0] and "loss_type -> --objective" in said[0]
    assert "optim adamw_torch (zoo's own)" in said[0]
    # TRL's batch is one forward pass's; zoo's --batch-size is the whole step's
    assert "4 x gradient_accumulation_steps 8 = 32, cut into 8 micro-batches" in said[0]
    assert "max_steps" not in said[0]  # -1: not set


def test_every_bad_key_is_refused_at_once_each_with_its_reason(tmp_path, capsys):
    config = tmp_path / "sft.yaml"
    config.write_text(
        "learning_rat: 1e-4\nwarmup_ratio: 0.1\nlr_scheduler_type: linear\nfp16: true\n"
        "loss_type: exo_pair\nnum_train_epochs: 2.5\nlr: 0.001\nlearning_rate: 0.002\n"
        "use_peft: true\n",
        encoding="utf-8",
    )
    with pytest.raises(SystemExit):
        main(["train", "gpt", "--config", str(config), "--data", "synthetic:addition"])
    err = capsys.readouterr().err
    where = f"--config {config}"
    for line in (
        "unknown key 'learning_rat', which names no flag of zoo train; the closest flag is --lr "
        "(TRL's learning_rate)",
        "warmup_ratio: did you mean --warmup? zoo's warmup is a number of steps",
        "lr_scheduler_type: 'linear' has no zoo equivalent; lr_scheduler_type takes 'cosine', "
        "'constant', 'constant_with_warmup', 'inverse_sqrt'",
        "fp16: not offered: zoo computes in bf16 or fp32 (--precision)",
        "loss_type: 'exo_pair' has no zoo equivalent",
        "num_train_epochs: '2.5' is not a whole number",
        "lr and learning_rate both set --lr (0.001 and 0.002); keep one",
        "use_peft: did you mean --lora rank=R,alpha=A,targets=...?",
    ):
        assert f"{where}: {line}" in err
    assert "mask-rate" not in err.partition("error:")[2]  # learning_rate once suggested it


def test_the_tables_name_flags_that_exist_and_keep_apart():
    train = _commands()["train"]
    flags = {action.dest for action in train._actions if action.option_strings}
    assert {alias.flag for alias in ALIASES.values()} <= flags
    assert not (set(ALIASES) | set(NOT_OFFERED)) & flags  # a zoo flag's name is zoo's
    assert set(SAME_AS_ZOO) <= set(NOT_OFFERED)  # other values are refused with a reason
    assert not set(ALIASES) & set(NOT_OFFERED)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Each `zoo` command's parser by name."""
    return next(
        action.choices
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )


def test_the_coming_from_trl_page_names_real_flags_and_every_name_of_the_tables():
    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    flags = {
        string
        for parser in _commands().values()
        for action in parser._actions
        for string in action.option_strings
    }
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", page))
    assert named - flags == set()
    assert {"--epochs", "--gradient-checkpointing", "--lr", "--accumulate"} <= named
    for name in [*ALIASES, *NOT_OFFERED]:
        assert f"`{name}`" in page, name
