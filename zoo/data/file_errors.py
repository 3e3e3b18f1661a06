"""Why a data file could not be read: the file, the line or byte, and the fix.

`datasets` reports a bad file as `DatasetGenerationError` or `StopIteration`, without naming
the file or the line. These checks find the cause: `check_files_not_empty` (a `stat`) and
`check_json_encoding` (one decoding pass) run before loading; `explain_load_error` reads the
files again only after a load has failed.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from pathlib import Path

from zoo.data.errors import DataError

COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


def check_files_not_empty(files: dict[str, list[str]]) -> None:
    """An empty file (0 bytes) is refused with the split it was meant to hold."""
    for split, paths in files.items():
        for path in paths:
            if Path(path).stat().st_size == 0:
                raise DataError(
                    f"{path} is empty (0 bytes), so the {split!r} split has no examples; "
                    "fill the file, or remove it"
                )


def check_json_encoding(files: dict[str, list[str]], encoding: str) -> None:
    """Every JSON file decodes as `encoding`: pyarrow reads invalid UTF-8 into its strings
    unchecked, and the error surfaces later, far from the file."""
    for paths in files.values():
        for name in paths:
            path = Path(name)
            if path.name.endswith(COMPRESSED):
                continue
            decoder = codecs.getincrementaldecoder(encoding)()
            try:
                with path.open("rb") as handle:
                    while chunk := handle.read(1 << 20):
                        decoder.decode(chunk)
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                data = path.read_bytes()
                try:
                    data.decode(encoding)
                except UnicodeDecodeError as bad:
                    raise DataError(_encoding_problem(path, data, encoding, bad)) from None


def explain_load_error(
    files: dict[str, list[str]], scheme: str, encoding: str, error: Exception
) -> DataError:
    """A `DataError` naming the file (and line or byte) that made `datasets` fail."""
    for paths in files.values():
        for path in paths:
            reason = _file_problem(Path(path), scheme, encoding)
            if reason is not None:
                return DataError(reason)
    every = [path for paths in files.values() for path in paths]
    cause = f"{type(error).__name__}: {error}"
    if error.__cause__ is not None:
        cause += f" ({type(error.__cause__).__name__}: {error.__cause__})"
    return DataError(
        f"could not read {every} as {scheme} files: {cause}; check that each file is "
        f"{scheme} as its name says"
    )


def _file_problem(path: Path, scheme: str, encoding: str) -> str | None:
    """What is wrong with one file, or None when nothing is found."""
    if scheme == "parquet" or path.name.endswith(COMPRESSED):
        return None
    data = path.read_bytes()
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as bad:
        return _encoding_problem(path, data, encoding, bad)
    if scheme == "json":
        return _json_problem(path, text)
    if scheme == "csv":
        return _csv_problem(path, text)
    return None


def _encoding_problem(path: Path, data: bytes, encoding: str, bad: UnicodeDecodeError) -> str:
    line = data.count(b"\n", 0, bad.start) + 1
    column = bad.start - (data.rfind(b"\n", 0, bad.start) + 1) + 1
    return (
        f"{path} is not {encoding} text: byte 0x{data[bad.start]:02x} at line {line}, column "
        f"{column} (byte offset {bad.start}) is not valid {encoding}; pass the file's encoding "
        "with --encoding NAME (encoding=... in Python; e.g. latin-1 or cp1252), or convert the "
        f"file to UTF-8 (iconv -f LATIN1 -t UTF-8 {path.name})"
    )


def _json_problem(path: Path, text: str) -> str | None:
    if path.suffix == ".json":
        try:
            json.loads(text)
            return None  # one JSON document (a list of rows): not a line problem
        except json.JSONDecodeError:
            pass  # a .json file may also hold JSON lines: look for the bad line
    rows = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as bad:
            return (
                f"{path} line {number} is not valid JSON ({bad.msg} at column {bad.colno}); "
                "each line of a JSON-lines file must be one object like "
                '{"text": "...", "label": 0}: fix or delete that line'
            )
        if not isinstance(row, dict):
            return (
                f"{path} line {number} is a JSON {type(row).__name__}, not an object; each "
                'line must be one object like {"text": "...", "label": 0}'
            )
        rows += 1
    if rows == 0:
        return f"{path} holds no JSON rows (only blank lines); fill it or remove it"
    return None


def _csv_problem(path: Path, text: str) -> str | None:
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if len(rows) == 1:
        return (
            f"{path} has a header ({', '.join(rows[0])}) but no rows below it; add rows or "
            "remove the file"
        )
    return None
