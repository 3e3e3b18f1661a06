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

import numpy as np

from zoo.data.errors import DataError

COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")
# A data row nested deeper than this is refused before pyarrow reads it: pyarrow refuses some
# 64 levels with an obscure error and crashes the process on some thousands; a chat row with
# tool calls is under 10 levels deep
MAX_ROW_DEPTH = 32


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
    """Every JSON file decodes as `encoding` (pyarrow reads invalid UTF-8 into its strings
    unchecked, and the error surfaces later, far from the file) and nests its rows at most
    `MAX_ROW_DEPTH` levels deep (pyarrow crashes the process on a row nested some thousands
    of levels deep)."""
    for paths in files.values():
        for name in paths:
            path = Path(name)
            if path.name.endswith(COMPRESSED):
                continue
            decoder = codecs.getincrementaldecoder(encoding)()
            nesting = _Nesting(path)
            try:
                with path.open("rb") as handle:
                    while chunk := handle.read(1 << 20):
                        nesting.read(decoder.decode(chunk))
                nesting.read(decoder.decode(b"", final=True), final=True)
            except UnicodeDecodeError:
                data = path.read_bytes()
                try:
                    data.decode(encoding)
                except UnicodeDecodeError as bad:
                    raise DataError(_encoding_problem(path, data, encoding, bad)) from None


class _Nesting:
    """How deeply a JSON file nests, read piece by piece: escaped backslashes and quotes are
    taken out, brackets between quotes are skipped (a JSON string never spans lines, so whole
    lines are read together), and the depth is the running sum of the brackets left."""

    NOT_SYNTAX = bytes(sorted(set(range(256)) - set(b'"[]{}')))  # every byte but these

    def __init__(self, path: Path) -> None:
        self.path, self.depth, self.lines, self.rest = path, 0, 0, ""

    def read(self, text: str, *, final: bool = False) -> None:
        text = self.rest + text
        end = len(text) if final else text.rfind("\n") + 1
        whole, self.rest = text[:end], text[end:]
        deepest, depth = self.deepest(whole, self.depth)
        if deepest > MAX_ROW_DEPTH:
            for number, line in enumerate(whole.splitlines(), start=self.lines + 1):
                deepest, self.depth = self.deepest(line, self.depth)
                if deepest > MAX_ROW_DEPTH:
                    raise DataError(
                        f"{self.path} line {number} nests its JSON deeper than "
                        f"{MAX_ROW_DEPTH} levels, which no row of data needs (and which "
                        "crashes the JSON reader): flatten or delete that row"
                    )
        self.depth, self.lines = depth, self.lines + whole.count("\n")

    def deepest(self, text: str, depth: int) -> tuple[int, int]:
        """The deepest level of `text`'s brackets, starting at `depth`, and the level at its end."""
        unescaped = text.replace("\\\\", "").replace('\\"', "")
        kept = unescaped.encode("utf-8", "surrogatepass").translate(None, self.NOT_SYNTAX)
        data = np.frombuffer(kept, np.uint8)
        quoted = np.cumsum(data == ord('"')) % 2 == 1
        opens = ((data == ord("[")) | (data == ord("{"))) & ~quoted
        closes = ((data == ord("]")) | (data == ord("}"))) & ~quoted
        levels = depth + np.cumsum(opens.astype(np.int64) - closes)
        if not len(levels):
            return depth, depth
        return max(depth, int(levels.max())), int(levels[-1])


def check_csv_headers(files: dict[str, list[str]], encoding: str) -> None:
    """A CSV header that names a column twice is refused: `datasets` would rename the second
    `output` to `output.1`, which nothing reads, and train on the first alone."""
    for paths in files.values():
        for path in paths:
            if path.endswith(COMPRESSED):
                continue
            header = _csv_header(Path(path), encoding)
            repeated = sorted({name for name in header if header.count(name) > 1})
            if repeated:
                positions = [i + 1 for i, name in enumerate(header) if name == repeated[0]]
                raise DataError(
                    f"{path} names the column {repeated[0]!r} {len(positions)} times (columns "
                    f"{', '.join(map(str, positions))} of its header); give each column its "
                    "own name, or delete the extra one"
                )


def _csv_header(path: Path, encoding: str) -> list[str]:
    try:
        with path.open(encoding=encoding, newline="") as handle:
            return next(csv.reader(handle), [])
    except (UnicodeDecodeError, csv.Error):
        return []  # told later, with the line, by explain_load_error


def explain_load_error(
    files: dict[str, list[str]], scheme: str, encoding: str, error: Exception
) -> DataError:
    """A `DataError` naming the file (and line or byte) that made `datasets` fail."""
    for paths in files.values():
        for path in paths:
            reason = _file_problem(Path(path), scheme, encoding)
            if reason is not None:
                return DataError(reason)
    differing = _differing_columns(files, scheme, encoding)
    if differing is not None:
        return DataError(differing)
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


def _first_columns(path: Path, scheme: str, encoding: str) -> list[str] | None:
    """The columns of a file's header (csv) or first row (json), None for other files."""
    if path.name.endswith(COMPRESSED):
        return None
    if scheme == "csv":
        return _csv_header(path, encoding)
    if scheme != "json":
        return None
    text = path.read_text(encoding=encoding)
    try:
        document = json.loads(text)
        rows = document if isinstance(document, list) else [document]
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines()[:1] if line.strip()]
    first = rows[0] if rows else None
    return sorted(first) if isinstance(first, dict) else None


def _differing_columns(files: dict[str, list[str]], scheme: str, encoding: str) -> str | None:
    """Files (of one split or of several) whose columns differ: `datasets` reads every file
    of a folder with the columns of the first and fails with an Arrow cast error."""
    seen: dict[str, list[str]] = {}
    for paths in files.values():
        for path in paths:
            columns = _first_columns(Path(path), scheme, encoding)
            if columns is not None:
                seen[path] = sorted(columns)
    if len({tuple(columns) for columns in seen.values()}) < 2:
        return None
    (first, first_columns), *others = seen.items()
    other, other_columns = next((p, c) for p, c in others if c != first_columns)
    only_first = [c for c in first_columns if c not in other_columns]
    only_other = [c for c in other_columns if c not in first_columns]
    return (
        f"the data files' columns differ: {first} has {first_columns}, {other} has "
        f"{other_columns} ({', '.join(only_first) or 'nothing'} only in the first, "
        f"{', '.join(only_other) or 'nothing'} only in the second); every file of every split "
        "needs the same columns: rename or drop columns until they match"
    )
