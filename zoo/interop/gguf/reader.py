"""The GGUF container (llama.cpp, Ollama, LM Studio), read with the `gguf` package's reader.

`read_gguf(path)` gives the file's metadata as plain Python values and its tensor table, each
tensor's stored data a view of the memory-mapped file (nothing of it is read until it is
dequantized by `read_tensors`). The file is a stranger's, so the package's reader runs inside
bounds:

- before it runs, the 24-byte header is checked: the magic `GGUF`, version 2 or 3 in
  little-endian order, and tensor and metadata counts that the file's size can hold;
- while it runs, every read must lie inside the file (the package's own reads past the end
  return short arrays), and an array's element count must fit in the bytes after it (the
  package loops over the elements one by one);
- after it runs, each tensor has 1 to 4 dimensions, a type the package dequantizes, and data
  that lies wholly inside the file at the file's alignment.

Whatever the package raises on a damaged file becomes one `GGUFError` line that names the file
and the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from zoo.interop.gguf.quants import (
    dequantize,
    dequantizes,
    gguf_package,
    supported_names,
    type_name,
)

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 had 32-bit counts and is long gone
HEADER_BYTES = 4 + 4 + 8 + 8  # magic, version, tensor count, metadata count
MAX_DIMS = 4  # GGML_MAX_DIMS
# the fewest bytes one table entry takes: a tensor (name length, dimension count, one size,
# type, offset) and a metadata entry (key length, value type, a one-byte value)
LEAST_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8
LEAST_ENTRY_BYTES = 8 + 4 + 1
# what the package's reader raises on a damaged file (a bad magic, a bad enum value, a short
# read, a duplicate key, a string that is not UTF-8, arrays nested without end)
READER_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    OverflowError,
    RecursionError,
    MemoryError,
    NotImplementedError,
)
ARRAY, STRING = 9, 8  # GGUF value types
# the fixed-size value types' sizes: uint8, int8, uint16, int16, uint32, int32, float32, bool,
# uint64, int64, float64
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class GGUFError(ValueError):
    """A GGUF file zoo refuses: the message names the file and the reason, on one line."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: `shape` in numpy order, `data` its stored values (typed
    for F32/F16, bytes for the block types), a view of the mapped file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's header: its metadata and its tensor table (the tensors stay on disk)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    def error(self, reason: str) -> GGUFError:
        return GGUFError(f"{self.path}: {reason}")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


class _PastTheEnd(Exception):
    """A read of the package's reader that would run past the end of the file."""


@cache
def _bounded_reader() -> type:
    """The package's `GGUFReader`, refusing every read that runs past the end of the file and
    every array whose count the rest of the file cannot hold. The two methods wrap the reader's
    internal read helpers (`_get`, `_get_field_parts`, as in gguf 0.19); the checks after
    reading (`_tensor`) do not depend on them."""

    class BoundedReader(gguf_package().GGUFReader):  # type: ignore[misc]
        def _get(self, offset: Any, dtype: Any, count: Any = 1, *rest: Any, **options: Any) -> Any:
            size = np.dtype(dtype).itemsize * int(count)
            if int(offset) + size > len(self.data):
                what = "a tensor's data" if hasattr(self, "data_offset") else "the header"
                raise _PastTheEnd(
                    f"truncated or damaged: {what} needs {size} bytes at byte {offset}, past "
                    f"the end of its {len(self.data)} bytes; an unfinished download? download "
                    "it again"
                )
            return super()._get(offset, dtype, count, *rest, **options)

        def _get_field_parts(self, offset: Any, value_type: Any, *rest: Any) -> Any:
            if int(value_type) == ARRAY:  # its element type and count come first
                element, count = (
                    int(self._get(offset, np.uint32)[0]),
                    int(self._get(offset + 4, np.uint64)[0]),
                )
                least = SCALAR_BYTES.get(element, 8 if element == STRING else 12)
                if count * least > len(self.data) - offset - 12:
                    raise _PastTheEnd(
                        f"an array at byte {offset} claims {count} elements, more than the "
                        f"{len(self.data) - offset - 12} bytes after it can hold: the file is "
                        "damaged or not a GGUF file"
                    )
            return super()._get_field_parts(offset, value_type, *rest)

    return BoundedReader


def _check_header(path: Path) -> None:
    """Refuse a file whose first 24 bytes are no little-endian GGUF header its size can hold."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise GGUFError(f"{path}: truncated: {size} bytes, fewer than a GGUF header's 24")
    with path.open("rb") as handle:
        header = handle.read(HEADER_BYTES)
    if header[:4] != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file: it starts with {header[:4]!r}, not {MAGIC!r}")
    version = int.from_bytes(header[4:8], "little")
    if version not in VERSIONS:
        swapped = int.from_bytes(header[4:8], "big")
        hint = " (a big-endian file: zoo reads little-endian GGUF)" if swapped in VERSIONS else ""
        raise GGUFError(
            f"{path}: GGUF version {version}{hint} is not supported; zoo reads versions "
            f"{', '.join(map(str, VERSIONS))}: convert it again with a current llama.cpp"
        )
    tensors = int.from_bytes(header[8:16], "little")
    entries = int.from_bytes(header[16:24], "little")
    if tensors * LEAST_TENSOR_BYTES + entries * LEAST_ENTRY_BYTES > size - HEADER_BYTES:
        raise GGUFError(
            f"{path}: it claims {tensors} tensors and {entries} metadata entries, more than its "
            f"{size} bytes can hold: the file is damaged or not a GGUF file"
        )


def _value(field: Any) -> Any:
    """A metadata field of the package's reader as a Python value (a list for an array)."""
    parts = [field.parts[index] for index in field.data]
    if not field.types:
        return None
    if field.types[0] == ARRAY:
        if field.types[-1] == STRING:
            return [bytes(part).decode("utf-8") for part in parts]
        return [value for part in parts for value in part.tolist()]
    if field.types[0] == STRING:
        return bytes(parts[0]).decode("utf-8")
    return parts[0].tolist()[0]


def _reason(error: BaseException) -> str:
    """The one-line reason for what the package's reader raised."""
    if isinstance(error, _PastTheEnd):
        return str(error)
    message = str(error.args[0] if isinstance(error, KeyError) and error.args else error)
    message = " ".join(message.split())[:300]
    if "GGMLQuantizationType" in message:
        return (
            f"a tensor has a GGML type zoo does not know ({message}); zoo reads {supported_names()}"
        )
    if isinstance(error, RecursionError):
        message = "its metadata nests arrays too deeply"
    return (
        f"the gguf package cannot read it ({type(error).__name__}: {message}): the file is "
        "damaged or not a GGUF file"
    )


def _tensor(path: Path, tensor: Any, data_start: int, alignment: int, size: int) -> TensorInfo:
    """One tensor of the package's reader, checked against the file."""
    name, dims = str(tensor.name), [int(d) for d in tensor.shape.tolist()]
    where = f"{path}: tensor {name}"
    if not 1 <= len(dims) <= MAX_DIMS:
        raise GGUFError(f"{where} has {len(dims)} dimensions; GGUF allows 1..{MAX_DIMS}")
    ggml_type = int(tensor.tensor_type)
    if not dequantizes(ggml_type):
        raise GGUFError(
            f"{where} is stored as {type_name(ggml_type)}, which the gguf package does not "
            f"dequantize; zoo reads {supported_names()}: requantize the model to one of them "
            "with llama.cpp's llama-quantize"
        )
    block_size, type_size = gguf_package().GGML_QUANT_SIZES[tensor.tensor_type]
    nbytes = prod(dims) // block_size * type_size
    offset = int(tensor.data_offset) - data_start
    if (
        offset % alignment
        or int(tensor.data_offset) + nbytes > size
        or tensor.data.nbytes != nbytes
    ):
        raise GGUFError(
            f"{where} ({nbytes} bytes at offset {offset}) lies outside the file's {size} bytes "
            f"or off its {alignment}-byte alignment: the file is truncated or damaged; "
            "download it again"
        )
    return TensorInfo(name, tuple(reversed(dims)), ggml_type, tensor.data)


def read_gguf(path: str | Path) -> GGUFFile:
    """The header of the GGUF file at `path` (metadata and tensor table; the tensor data stays
    on disk, mapped)."""
    path = Path(path)
    gguf_package()  # first: without the package, say what installs it
    _check_header(path)
    reader_class = _bounded_reader()
    try:
        reader = reader_class(str(path))
        metadata = {
            name: _value(field)
            for name, field in reader.fields.items()
            if not name.startswith("GGUF.")  # the header, as the reader lists it
        }
    except (*READER_ERRORS, _PastTheEnd) as error:
        raise GGUFError(f"{path}: {_reason(error)}") from None
    size, alignment = len(reader.data), int(reader.alignment)
    tensors = {
        str(t.name): _tensor(path, t, int(reader.data_offset), alignment, size)
        for t in reader.tensors
    }
    version = int(reader.fields["GGUF.version"].parts[0][0])
    return GGUFFile(path, version, metadata, tensors)


def read_tensors(gguf: GGUFFile, dtype: Any = np.float32) -> Iterator[tuple[str, np.ndarray]]:
    """`(name, array)` for every tensor of `gguf`, dequantized by the `gguf` package and cast
    to `dtype`, one at a time (a quantized file's float copy is built tensor by tensor)."""
    for info in gguf.tensors.values():
        try:
            values = dequantize(info.data, info.ggml_type, info.shape)
        except READER_ERRORS as error:
            raise gguf.error(f"tensor {info.name}: {_reason(error)}") from None
        yield info.name, values.astype(dtype, copy=False)
