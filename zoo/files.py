"""Files written whole or not at all, and JSON files read with an error that names the file.

Every file zoo writes beside a model or a run (config, tokenizer, weights, records) goes through
`write_atomic`: a crash or a full disk leaves the old file or the new one, never half of one, and
no temporary file behind. A folder written as one thing (an exported checkpoint) is written in
a hidden folder beside its place and moved there at the end (`folder_written_whole`), so an
interrupted write leaves nothing that looks complete. Every damaged file is reported the same way: `damaged(path, detail,
fix)` says which file, what is wrong with it and what to do.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

# JSON nested deeper than this is refused: every file zoo reads is a few levels deep, and a
# crafted file of 100,000 levels would otherwise exhaust Python's recursion
MAX_JSON_DEPTH = 64
# A JSON file longer than this is refused before it is parsed: the largest zoo reads are a
# tokenizer's `tokenizer_config.json` or a word vocabulary (a few MB), a config is a few kB
MAX_JSON_BYTES = 64 * 2**20

# What `json.loads` gives: objects, arrays, strings, numbers, booleans and null, nested.
if TYPE_CHECKING:
    JSONValue: TypeAlias = (
        dict[str, "JSONValue"] | list["JSONValue"] | str | int | float | bool | None
    )
else:  # beartype cannot follow a recursive alias: at run time the first level is checked
    JSONValue: TypeAlias = dict[str, object] | list[object] | str | int | float | bool | None
JSONObject: TypeAlias = dict[str, JSONValue]  # a JSON object, such as a whole config file


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary)` beside `path`, then the temporary file renamed over `path`.

    On any error the temporary file is removed and the error propagates; `path` is untouched.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write a UTF-8 text file so that a crash never leaves it half-written."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# the end of a folder's name while it is written, before it takes its place (`.NAME.1a2b.partial`)
PARTIAL_SUFFIX = ".partial"


@contextmanager
def folder_written_whole(path: Path, *, last: Sequence[str] = ()) -> Iterator[Path]:
    """A new hidden folder beside `path` to write into, that becomes `path` when the block ends.

    Leaving the block normally flushes its files to disk and moves them into place: the folder
    is renamed to `path` where that is absent or empty, else each entry replaces its namesake in
    `path` (those named in `last` after the rest: the file that marks the folder as complete)
    and the other entries of `path` stay. On any error, Ctrl-C (KeyboardInterrupt) included,
    the hidden folder is removed and `path` is as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_partial_folder(path)
    try:
        yield staging
        sync_files(staging)
        _move_into_place(staging, path, last)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _new_partial_folder(path: Path) -> Path:
    """`.NAME.<random>.partial` beside `path`, made with the permissions a new folder gets
    (`tempfile.mkdtemp`'s would be private to its owner)."""
    while True:
        staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
        try:
            staging.mkdir()
            return staging
        except FileExistsError:
            continue


def _move_into_place(staging: Path, path: Path, last: Sequence[str]) -> None:
    if not path.exists() or (not path.is_symlink() and path.is_dir() and not any(path.iterdir())):
        if path.exists():
            path.rmdir()
        os.replace(staging, path)
        return
    entries = sorted(staging.iterdir(), key=lambda entry: (entry.name in last, entry.name))
    for entry in entries:
        target = path / entry.name
        if entry.is_dir() and target.is_dir():
            shutil.rmtree(target)
        os.replace(entry, target)
    staging.rmdir()


def sync_files(directory: Path) -> None:
    """Flush the files directly in `directory` to disk (its folders are left to their own
    writers), before it is published under its final name."""
    for path in directory.iterdir():
        if path.is_dir():
            continue
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def damaged(path: Path, detail: str, fix: str) -> ValueError:
    """The error for a file that is there but cannot be read as what its name says."""
    return ValueError(f"{path} is damaged ({detail}); {fix}")


def read_json_object(path: Path, *, fix: str, missing_ok: bool = False) -> JSONObject:
    """The JSON object in `path`; a truncated or garbled file is reported as damaged, with `fix`.

    With `missing_ok`, a file that is not there reads as `{}` (an optional file of a folder)."""
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(read_bounded(path, MAX_JSON_BYTES, "a JSON file").decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise damaged(path, f"not valid JSON: {error}", fix) from None
    except RecursionError:
        raise damaged(path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", fix) from None
    if not isinstance(data, dict):
        raise damaged(path, f"a JSON {type(data).__name__}, not an object", fix)
    if json_depth(data) > MAX_JSON_DEPTH:
        raise damaged(path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", fix)
    return data


class TooLarge(ValueError):
    """A file longer than zoo's bound for its kind; the message names the file and the bound."""


def read_bounded(path: Path, bound: int, what: str) -> bytes:
    """The bytes of `path`, refused with `TooLarge` when it holds more than `bound` (only
    `bound + 1` bytes are read, so a file of any size, or an endless one, costs no more)."""
    with path.open("rb") as handle:
        data = handle.read(bound + 1)
    if len(data) > bound:
        raise TooLarge(
            f"{path} refused: it holds more than the {bound:,} bytes zoo reads of {what}; a "
            "real one is far smaller, so check that it is the file you meant"
        )
    return data


def json_depth(value: object) -> int:
    """How deeply `value` nests lists and dicts (a scalar is 0, `{"a": [1]}` is 2); iterative,
    so a value of any depth is measured without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend(
                (child, depth) for child in (node.values() if isinstance(node, dict) else node)
            )
    return deepest


def save_safetensors(
    arrays: Mapping[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.numpy.save_file`, with a failed write raised as the `OSError` it is.

    safetensors reports a full disk or a file-size limit as its own `SafetensorError` ("I/O
    error: ... (os error 28)"); callers that handle `OSError` (a full disk keeps the old files
    and says so) then see it as one, with the system's errno and message.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(dict(arrays), str(path), metadata=metadata)
    except SafetensorError as error:
        code = re.search(r"os error (\d+)", str(error))
        if code is None:
            raise
        errno = int(code.group(1))
        raise OSError(errno, f"{os.strerror(errno)} while writing {path}") from None
