"""Ctrl-C (and SIGTERM where a command writes) ends any `zoo` command with one line and the
shell's status, no traceback; an interrupted `zoo export` leaves its folder as it was."""

from __future__ import annotations

import os
import signal

import pytest

from tests.cli.test_export_cli import TEXTS, export, saved
from zoo.cli import main
from zoo.cli import presets as presets_command
from zoo.data.tokenizers import build_tokenizer
from zoo.interop import export as export_module


@pytest.fixture
def run_folder(tmp_path):
    return saved(tmp_path / "run", "gpt-tiny", build_tokenizer("word", TEXTS))


def test_ctrl_c_in_any_command_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(presets_command, "run", interrupted)
    assert main(["presets"]) == 130
    assert capsys.readouterr().err == "zoo presets: interrupted\n"


def test_ctrl_c_during_export_leaves_no_folder(run_folder, tmp_path, monkeypatch, capsys):
    written = []

    def weights_hit_by_ctrl_c(arrays, path):  # config.json is written, the weights are not
        written.extend(sorted(p.name for p in path.parent.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module, "write_safetensors", weights_hit_by_ctrl_c)
    status, out, err = export(capsys, str(run_folder), "--hf", str(tmp_path / "hf"),
                              "--no-tokenizer")  # fmt: skip
    assert (status, out, err) == (130, "", "zoo export: interrupted\n")
    assert written == ["config.json"]  # it was stopped mid-write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder, no hidden one


def test_an_interrupted_forced_export_keeps_the_old_one(run_folder, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hf"
    assert export(capsys, str(run_folder), "--hf", str(out), "--no-tokenizer")[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "config.json").write_text('{"old": true}')
    before["config.json"] = b'{"old": true}'

    def weights_hit_by_sigterm(arrays, path):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the export stops here
        raise AssertionError("SIGTERM did not stop the export")

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(export_module, "write_safetensors", weights_hit_by_sigterm)
    status, _, err = export(capsys, str(run_folder), "--hf", str(out), "--no-tokenizer",
                            "--force")  # fmt: skip
    assert (status, err) == (143, "zoo export: terminated (SIGTERM)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]
    assert signal.getsignal(signal.SIGTERM) == handler  # the command's handler is gone again
