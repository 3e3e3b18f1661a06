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
- the counts, strings and arrays stay inside zoo's bounds (`MAX_TENSORS`, `MAX_ENTRIES`,
  `MAX_STRING_BYTES`, `MAX_ARRAY_ELEMENTS`, `MAX_METADATA_ELEMENTS`, `MAX_METADATA_BYTES`),
  which bound the time and memory a file can cost whatever its size;
- after it runs, each tensor has 1 to 4 dimensions, a type the package dequantizes, and data
  that lies wholly inside the file at the file's alignment.

Whatever the package raises on a damaged file becomes one `GGUFError` line that names the file
and the reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import numpy.typing as npt

from zoo.interop.gguf.quants import (
    dequantize,
    dequantizes,
    require_gguf,
    supported_names,
    type_name,
)

if TYPE_CHECKING:
    import gguf

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 had 32-bit counts and is long gone
HEADER_BYTES = 4 + 4 + 8 + 8  # magic, version, tensor count, metadata count
MAX_DIMS = 4  # GGML_MAX_DIMS
# Bounds on what the header may claim. The package's reader walks every array element in
# Python (tens of microseconds each), so the element counts bound the time a file can cost;
# real files sit far inside them (a 262,144-token vocabulary: three arrays of 262,144, about
# 4 MB of strings; a few hundred to a few thousand tensors; a few dozen entries)
MAX_TENSORS = 65_536  # entries of the tensor table
MAX_ENTRIES = 65_536  # metadata entries
MAX_STRING_BYTES = 16 * 2**20  # one string: a key, a value, a token, a tensor's name
MAX_ARRAY_ELEMENTS = 2**20  # elements of one metadata array
MAX_METADATA_ELEMENTS = 2**22  # array elements of all the metadata together
MAX_METADATA_BYTES = 64 * 2**20  # bytes of all its strings together
BOUND_HINT = "a real model's file holds far fewer; the file is damaged or hostile"
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
# A metadata value as the file holds it: a number, a bool or a string, or an array of them
# (read as one flat list)
GGUFScalar = int | float | bool | str
GGUFValue = GGUFScalar | list[GGUFScalar]


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
    metadata: dict[str, GGUFValue]
    tensors: dict[str, TensorInfo]

    def error(self, reason: str) -> GGUFError:
        return GGUFError(f"{self.path}: {reason}")

    def get(self, key: str, default: GGUFValue | None = None) -> GGUFValue | None:
        return self.metadata.get(key, default)

    @overload
    def integer(self, key: str) -> int | None: ...
    @overload
    def integer(self, key: str, default: int) -> int: ...
    def integer(self, key: str, default: int | None = None) -> int | None:
        """The integer at `key` (`default` where there is none); another value is refused."""
        value = self.get(key, default)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise self.error(f"{key} is {_shown(value)}, not an integer")

    @overload
    def number(self, key: str) -> float | None: ...
    @overload
    def number(self, key: str, default: float) -> float: ...
    def number(self, key: str, default: float | None = None) -> float | None:
        """The number at `key` as a float (`default` where there is none); another value, or
        an infinite or NaN one, is refused."""
        value = self.get(key, default)
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(f"{key} is {_shown(value)}, not a number")
        if not math.isfinite(value):
            raise self.error(f"{key} is {value}; it must be a finite number")
        return float(value)

    def text(self, key: str) -> str | None:
        """The string at `key`, or None where there is none; another value is refused."""
        value = self.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self.error(f"{key} is {_shown(value)}, not a string")


def _shown(value: GGUFValue) -> str:
    """`value` as a message shows it: its start (a token list can hold 150,000 strings)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class _OutOfBounds(Exception):
    """A read of the package's reader that would run past the end of the file, or past one of
    zoo's bounds."""


@cache
def _bounded_reader() -> type[gguf.GGUFReader]:
    """The package's `GGUFReader`, refusing every read that runs past the end of the file and
    every array whose count the rest of the file cannot hold. The two methods wrap the reader's
    internal read helpers (`_get`, `_get_field_parts`, as in gguf 0.19); the checks after
    reading (`_tensor`) do not depend on them. Offsets and counts arrive as Python or numpy
    integers (the package passes array elements on)."""
    require_gguf()
    from gguf import GGUFReader, GGUFValueType

    class BoundedReader(GGUFReader):
        def __init__(self, path: str) -> None:
            self.elements_read = 0  # array elements of the metadata, all arrays together
            self.string_bytes_read = 0  # bytes of every string, together
            super().__init__(path)

        def _get_str(self, offset: int) -> tuple[np.ndarray, np.ndarray]:
            length = int(self._get(offset, np.uint64)[0])
            if offset + 8 + length > len(self.data):  # `_get` names the end of the file
                return super()._get_str(offset)
            self.string_bytes_read += length
            if length > MAX_STRING_BYTES or self.string_bytes_read > MAX_METADATA_BYTES:
                bound, what = (
                    (MAX_STRING_BYTES, f"a string of {length:,} bytes")
                    if length > MAX_STRING_BYTES
                    else (MAX_METADATA_BYTES, f"{self.string_bytes_read:,} bytes of strings")
                )
                raise _OutOfBounds(
                    f"its header holds {what} at byte {offset}, past zoo's bound of "
                    f"{bound:,} bytes ({BOUND_HINT})"
                )
            return super()._get_str(offset)

        def _get(
            self,
            offset: int | np.integer,
            dtype: npt.DTypeLike,
            count: int | np.integer = 1,
            override_order: Literal["I", "S", "<"] | None = None,
        ) -> np.ndarray:
            size = np.dtype(dtype).itemsize * int(count)
            if int(offset) + size > len(self.data):
                what = "a tensor's data" if hasattr(self, "data_offset") else "the header"
                raise _OutOfBounds(
                    f"truncated or damaged: {what} needs {size} bytes at byte {offset}, past "
                    f"the end of its {len(self.data)} bytes; an unfinished download? download "
                    "it again"
                )
            return super()._get(int(offset), dtype, int(count), override_order)

        def _get_field_parts(
            self, offset: int | np.integer, value_type: int | np.integer
        ) -> tuple[int, list[np.ndarray], list[int], list[GGUFValueType]]:
            if int(value_type) == ARRAY:  # its element type and count come first
                element, count = (
                    int(self._get(offset, np.uint32)[0]),
                    int(self._get(offset + 4, np.uint64)[0]),
                )
                least = SCALAR_BYTES.get(element, 8 if element == STRING else 12)
                if count * least > len(self.data) - offset - 12:
                    raise _OutOfBounds(
                        f"an array at byte {offset} claims {count} elements, more than the "
                        f"{len(self.data) - offset - 12} bytes after it can hold: the file is "
                        "damaged or not a GGUF file"
                    )
                self.elements_read += count
                if count > MAX_ARRAY_ELEMENTS or self.elements_read > MAX_METADATA_ELEMENTS:
                    bound, what = (
                        (MAX_ARRAY_ELEMENTS, f"an array of {count:,} elements")
                        if count > MAX_ARRAY_ELEMENTS
                        else (MAX_METADATA_ELEMENTS, f"{self.elements_read:,} array elements")
                    )
                    raise _OutOfBounds(
                        f"its metadata holds {what} at byte {offset}, past zoo's bound of "
                        f"{bound:,} ({BOUND_HINT})"
                    )
            return super()._get_field_parts(int(offset), int(value_type))

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
    for count, bound, what in (
        (tensors, MAX_TENSORS, "tensors"),
        (entries, MAX_ENTRIES, "metadata entries"),
    ):
        if count > bound:
            raise GGUFError(
                f"{path}: it claims {count:,} {what}, past zoo's bound of {bound:,} ({BOUND_HINT})"
            )


def _value(field: gguf.ReaderField) -> GGUFValue:
    """A metadata field of the package's reader as a Python value (a list for an array)."""
    parts = [field.parts[index] for index in field.data]
    if not field.types:
        raise ValueError(f"the metadata entry {field.name} has no type")
    if field.types[0] == ARRAY:
        if field.types[-1] == STRING:
            return [bytes(part).decode("utf-8") for part in parts]
        return [_scalar(value) for part in parts for value in part.tolist()]
    if field.types[0] == STRING:
        return bytes(parts[0]).decode("utf-8")
    return _scalar(parts[0].tolist()[0])


def _scalar(value: object) -> GGUFScalar:
    """One number or bool of a metadata field, as numpy's `tolist` gives it."""
    if isinstance(value, int | float | str):
        return value
    raise TypeError(f"a metadata value of type {type(value).__name__}")


def _reason(error: BaseException) -> str:
    """The one-line reason for what the package's reader raised."""
    if isinstance(error, _OutOfBounds):
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


def _tensor(
    path: Path, tensor: gguf.ReaderTensor, data_start: int, alignment: int, size: int
) -> TensorInfo:
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
    from gguf import GGML_QUANT_SIZES

    block_size, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
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
    require_gguf()  # first: without the package, say what installs it
    _check_header(path)
    reader_class = _bounded_reader()
    try:
        reader = reader_class(str(path))
        metadata = {
            name: _value(field)
            for name, field in reader.fields.items()
            if not name.startswith("GGUF.")  # the header, as the reader lists it
        }
    except (*READER_ERRORS, _OutOfBounds) as error:
        raise GGUFError(f"{path}: {_reason(error)}") from None
    size, alignment = len(reader.data), int(reader.alignment)
    tensors = {
        str(t.name): _tensor(path, t, int(reader.data_offset), alignment, size)
        for t in reader.tensors
    }
    version = int(reader.fields["GGUF.version"].parts[0][0])
    return GGUFFile(path, version, metadata, tensors)


def read_tensors(
    gguf: GGUFFile, dtype: npt.DTypeLike = np.float32
) -> Iterator[tuple[str, np.ndarray]]:
    """`(name, array)` for every tensor of `gguf`, dequantized by the `gguf` package and cast
    to `dtype`, one at a time (a quantized file's float copy is built tensor by tensor)."""
    for info in gguf.tensors.values():
        try:
            values = dequantize(info.data, info.ggml_type, info.shape)
        except READER_ERRORS as error:
            raise gguf.error(f"tensor {info.name}: {_reason(error)}") from None
        yield info.name, values.astype(dtype, copy=False)
