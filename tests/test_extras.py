"""The distribution name and the install hints: one name, matching pyproject.toml, everywhere."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from zoo.data import bleu
from zoo.extras import DISTRIBUTION, pip_install

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_distribution_is_named_as_in_pyproject_and_not_zoo():
    # `zoo` on PyPI is an unrelated project: `pip install zoo` must not be what we tell people
    assert PROJECT["name"] == DISTRIBUTION == "jax-transformer-zoo"
    assert PROJECT["scripts"] == {"zoo": "zoo.cli:main"}


def test_pip_install_names_the_distribution_and_the_extra():
    assert pip_install("hf") == "pip install 'jax-transformer-zoo[hf]'"


def test_every_extra_the_code_asks_for_exists():
    sources = "\n".join(path.read_text() for path in (ROOT / "zoo").rglob("*.py"))
    asked = set(re.findall(r"pip_install\(['\"](\w+)['\"]\)", sources))
    assert asked == {"hf", "plot", "bleu", "bench", "distributed", "chat", "gguf", "serve"}
    assert asked <= set(PROJECT["optional-dependencies"])


def test_no_install_hint_names_the_wrong_distribution():
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "zoo").rglob("*.py")]
    wrong = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in texts
        for line in path.read_text().splitlines()
        if re.search(r"pip install ['\"]?zoo\b", line)
    ]
    assert wrong == []


def test_bleu_without_sacrebleu_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # makes `import sacrebleu` fail
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[bleu\]'"):
        bleu(["a b"], ["a b"])
