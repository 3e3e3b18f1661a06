"""Files written whole or not at all, and JSON files read with an error that names the file.

Every file zoo writes beside a model or a run (config, tokenizer, weights, records) goes through
`write_atomic`: a crash or a full disk leaves the old file or the new one, never half of one, and
no temporary file behind. Every damaged file is reported the same way: `damaged(path, detail,
fix)` says which file, what is wrong with it and what to do.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def damaged(path: Path, detail: str, fix: str) -> ValueError:
    """The error for a file that is there but cannot be read as what its name says."""
    return ValueError(f"{path} is damaged ({detail}); {fix}")


def read_json_object(path: Path, *, fix: str, missing_ok: bool = False) -> dict[str, Any]:
    """The JSON object in `path`; a truncated or garbled file is reported as damaged, with `fix`.

    With `missing_ok`, a file that is not there reads as `{}` (an optional file of a folder)."""
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise damaged(path, f"not valid JSON: {error}", fix) from None
    if not isinstance(data, dict):
        raise damaged(path, f"a JSON {type(data).__name__}, not an object", fix)
    return data
