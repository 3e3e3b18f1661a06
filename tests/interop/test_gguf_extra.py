"""Without the `gguf` package, a `.gguf` file is refused with one line that says what installs it
(the package is hidden here, so this runs with or without it)."""

from __future__ import annotations

import sys

import pytest

import zoo
from zoo.cli import main
from zoo.extras import pip_install


@pytest.fixture
def without_gguf(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(40))
    return path


def test_from_pretrained_says_what_to_install(without_gguf):
    with pytest.raises(ImportError) as caught:
        zoo.from_pretrained(without_gguf)
    message = str(caught.value)
    assert message == f"reading a .gguf file needs the gguf package: {pip_install('gguf')}"
    assert "\n" not in message and caught.value.__cause__ is None


def test_the_command_line_says_what_to_install(without_gguf, capsys):
    assert main(["generate", str(without_gguf), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"needs the gguf package: {pip_install('gguf')}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
