"""Files written whole or not at all, and damaged JSON named with what to do."""

from __future__ import annotations

import pytest

from zoo.files import (
    MAX_JSON_DEPTH,
    folder_written_whole,
    json_depth,
    read_json_object,
    write_atomic,
    write_text_atomic,
)


def test_an_atomic_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "config.json"
    write_text_atomic(path, '{"a": 1}')
    write_text_atomic(path, '{"a": 2, "b": "\u00e9"}')
    assert read_json_object(path, fix="unused") == {"a": 2, "b": "\u00e9"}
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"old")

    def crash(tmp):
        tmp.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, crash)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"a": ', r"not valid JSON: Expecting value: line 1 column 7"),
        ("[1, 2]", "a JSON list, not an object"),
    ],
)
def test_damaged_json_names_the_file_the_fault_and_the_fix(tmp_path, text, detail):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{path} is damaged \({detail}.*\); download it again$"):
        read_json_object(path, fix="download it again")


@pytest.mark.parametrize("levels", [65, 100_000])
def test_json_nested_past_the_limit_is_damaged_not_a_recursion_error(tmp_path, levels):
    path = tmp_path / "state.json"
    path.write_text('{"a": ' + "[" * levels + "]" * levels + "}")
    with pytest.raises(ValueError, match=rf"^{path} is damaged \(JSON nested deeper than 64"):
        read_json_object(path, fix="set it aside")


def test_json_at_the_limit_reads():
    assert json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth(3) == 0
    nested: list = []
    for _ in range(MAX_JSON_DEPTH - 2):
        nested = [nested]
    assert json_depth({"a": nested}) == MAX_JSON_DEPTH


FILE_SIZE_LIMIT = """
import resource, signal, sys
import numpy as np
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG, as a full disk does
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
from pathlib import Path
from zoo.files import save_safetensors
try:
    save_safetensors({"a": np.zeros(100_000, np.float32)}, Path(sys.argv[1]))
except OSError as error:
    print("OSError", error.errno, error)
"""


def test_a_failed_safetensors_write_is_an_os_error_with_its_errno(tmp_path):
    """safetensors raises its own SafetensorError on a full disk; zoo's callers handle OSError."""
    import errno
    import subprocess
    import sys

    path = tmp_path / "model.safetensors"
    result = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout
        == f"OSError {errno.EFBIG} [Errno {errno.EFBIG}] File too large while writing {path}\n"
    )


def test_a_folder_written_whole_takes_its_place_only_at_the_end(tmp_path):
    target = tmp_path / "export"
    with folder_written_whole(target) as staging:
        (staging / "weights").write_bytes(b"new")
        assert staging.parent == tmp_path and staging.name.startswith(".export.")
        assert not target.exists()  # nothing looks complete while it is written
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    assert (target / "weights").read_bytes() == b"new"
    # a new folder gets the permissions of any new folder (umask), not a private temp's 0700
    (tmp_path / "plain").mkdir()
    assert target.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777


def test_an_interrupted_folder_leaves_the_old_one_and_no_hidden_folder(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "weights").write_bytes(b"old")
    (target / "notes.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt), folder_written_whole(target) as staging:
        (staging / "weights").write_bytes(b"half")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert (target / "weights").read_bytes() == b"old"
    # finished, it replaces its namesakes and keeps the folder's other files
    with folder_written_whole(target, last=("weights",)) as staging:
        (staging / "weights").write_bytes(b"new")
        (staging / "config").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config", "notes.txt", "weights"]
    assert (target / "weights").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_folder_written_whole_fills_an_empty_folder(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    with folder_written_whole(target) as staging:
        (staging / "config").write_text("{}")
        (staging / "tokenizer").mkdir()  # a folder of its own moves with it
    assert sorted(p.name for p in target.iterdir()) == ["config", "tokenizer"]
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_json_past_the_size_bound_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """Every JSON file read through `read_json_object` (a checkpoint's config.json, its
    safetensors index, tokenizer_config.json, generation_config.json, a run's records) is
    held to `MAX_JSON_BYTES`; only one byte past it is read."""
    from zoo import files
    from zoo.interop.files import INDEX, read_config
    from zoo.interop.weights import read_weights

    monkeypatch.setattr(files, "MAX_JSON_BYTES", 20)
    path = tmp_path / "config.json"
    path.write_text('{"a": "' + "x" * 11 + '"}')  # 20 bytes: at the bound
    assert read_json_object(path, fix="unused") == {"a": "x" * 11}
    path.write_text('{"a": "' + "x" * 12 + '"}')
    message = (
        rf"^{path} refused: it holds more than the 20 bytes zoo reads of a JSON file; a real "
        r"one is far smaller, so check that it is the file you meant$"
    )
    with pytest.raises(files.TooLarge, match=message):
        read_json_object(path, fix="unused")
    with pytest.raises(files.TooLarge, match=message):
        read_config(tmp_path)
    (tmp_path / INDEX).write_text('{"weight_map": {"a": "model-1.safetensors"}}')
    with pytest.raises(files.TooLarge, match=rf"^{tmp_path / INDEX} refused: it holds more than"):
        read_weights(tmp_path)
