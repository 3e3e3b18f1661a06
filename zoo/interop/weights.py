"""The tensors of a checkpoint folder, as numpy arrays: read them, and write safetensors.

Weights are read with `safetensors.numpy` (no torch needed). bfloat16 tensors, which numpy
lacks, go through `ml_dtypes` (installed with jax). A folder with only `pytorch_model.bin` (a
pickle) is read through `torch.load(weights_only=True)` by `torch_weights.py`, never unpickled.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from zoo.files import save_safetensors, write_atomic
from zoo.interop.files import INDEX, PICKLE, PICKLE_INDEX, WEIGHTS, damaged, read_json
from zoo.interop.torch_weights import read_torch_file

Arrays = dict[str, np.ndarray]


def read_weights(folder: Path) -> Arrays:
    """Every tensor of `model.safetensors`, or of the shards its index lists; failing those, of
    `pytorch_model.bin` or its shards (read with torch's weights-only loader)."""
    for single, index, read in (
        (folder / WEIGHTS, folder / INDEX, read_safetensors),
        (folder / PICKLE, folder / PICKLE_INDEX, read_torch_file),
    ):
        if single.is_file():
            return read(single)
        if index.is_file():
            return _read_shards(index, read)
    raise FileNotFoundError(
        f"{folder} has none of {WEIGHTS}, {INDEX}, {PICKLE} or {PICKLE_INDEX}: download the "
        "weights into it (see docs/pretrained.md)"
    )


def _read_shards(index: Path, read: Callable[[Path], Arrays]) -> Arrays:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise damaged(index, "no weight_map")
    arrays: Arrays = {}
    for shard in sorted({check_shard_name(index, name) for name in weight_map.values()}):
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(
                f"{index} lists the shard {shard}, which is not in {index.parent}: download it"
            )
        arrays.update(read(index.parent / shard))
    return arrays


def check_shard_name(index: Path, shard: object) -> str:
    """`shard`, a file name of the index's weight map; refused if the index places it outside
    its own folder (an absolute path, or one that climbs out with `..`): a checkpoint reads only
    its own files. The name is checked as written, so a hub snapshot whose files are symlinks
    into the cache still loads."""
    if not isinstance(shard, str) or not shard:
        raise damaged(index, f"its weight_map names a shard {shard!r}, not a file name")
    parts = Path(shard).parts
    if Path(shard).is_absolute() or shard.startswith(("/", "\\")) or ".." in parts:
        raise ValueError(
            f"{index} refused: it points a shard at {shard!r}, outside the checkpoint folder "
            f"{index.parent}; a checkpoint's shards are files inside its own folder"
        )
    return shard


def read_safetensors(path: Path) -> Arrays:
    try:
        return load_file(path)
    except KeyError:  # a dtype numpy does not know (bfloat16)
        return _read_raw(path)
    except SafetensorError as error:
        raise damaged(path, f"safetensors: {error}") from None


_RAW_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


def _read_raw(path: Path) -> Arrays:
    """Read the safetensors layout directly: an 8-byte header size, a JSON header, the bytes."""
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + header_size])
    except (ValueError, RecursionError):
        raise damaged(path, "its safetensors header is not valid JSON") from None
    body = memoryview(data)[8 + header_size :]
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _RAW_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        dtype = _RAW_DTYPES[info["dtype"]]
        arrays[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(info["shape"])
    return arrays


def write_safetensors(arrays: Mapping[str, np.ndarray], path: Path) -> None:
    """Write `arrays` as safetensors (with transformers' "pt" format tag); bfloat16 included.

    The file is replaced whole or not at all (`zoo.files.write_atomic`).
    """
    write_atomic(path, lambda tmp: _write(arrays, tmp))


def _write(arrays: Mapping[str, np.ndarray], path: Path) -> None:
    metadata = {"format": "pt"}
    if not any(a.dtype == ml_dtypes.bfloat16 for a in arrays.values()):
        save_safetensors({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path, metadata)
        return
    names = {np.dtype(v): k for k, v in _RAW_DTYPES.items()}
    header: dict[str, object] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        if array.dtype not in names:
            raise ValueError(f"cannot write {name} of dtype {array.dtype} with bfloat16 tensors")
        raw = array.tobytes()
        header[name] = {
            "dtype": names[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for chunk in chunks:
            handle.write(chunk)
