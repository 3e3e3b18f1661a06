"""Files written whole or not at all, and damaged JSON named with what to do."""

from __future__ import annotations

import pytest

from zoo.files import read_json_object, write_atomic, write_text_atomic


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
