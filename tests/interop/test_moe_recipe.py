"""docs/moe.md's recipe runs as written: its shell lines (`python -c`, `zoo export`) and then
its Python block, in an empty folder; the block's own assert compares the logits."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.doc_commands import FENCE
from zoo.cli import main

pytestmark = [pytest.mark.hf, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("transformers")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "moe.md"
HEADING = "### Recipe: export a mixture, compare its logits with transformers"


def recipe() -> tuple[list[str], str]:
    """(the shell lines, the Python block) under the recipe's heading."""
    section = re.split(r"\n#{2,3} ", PAGE.read_text().split(HEADING, 1)[1], maxsplit=1)[0]
    blocks = dict((language, body) for language, body in FENCE.findall(section))
    return [line for line in blocks["bash"].splitlines() if line.strip()], blocks["python"]


def test_the_moe_export_recipe_runs_as_written(tmp_path, monkeypatch, capsys):
    shell, python = recipe()
    monkeypatch.chdir(tmp_path)
    for line in shell:
        program, *words = shlex.split(line)
        if program == "python":
            assert words[0] == "-c"
            exec(words[1], {})
        else:
            assert program == "zoo"
            assert main(words) == 0
    exec(python, {})
    printed = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"MixtralForCausalLM \S+", printed), printed
