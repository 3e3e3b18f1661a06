"""Checkpoint folders: find them (local or on the HuggingFace hub), read and write safetensors.

Weights are read with `safetensors.numpy` (no torch needed). bfloat16 tensors, which numpy
lacks, go through `ml_dtypes` (installed with jax). A folder with only `pytorch_model.bin` (a
pickle) is read through `torch.load(weights_only=True)` by `torch_weights.py`, never unpickled.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from zoo.extras import pip_install

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
WEIGHT_PATTERNS = [CONFIG, "generation_config.json", WEIGHTS, INDEX, "model-*.safetensors"]
# downloaded only when the repository has no safetensors weights
PICKLE_PATTERNS = [PICKLE, PICKLE_INDEX, "pytorch_model-*.bin"]
TOKENIZER_PATTERNS = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.spm",
    "*.model",
]
INSTALL_HF = pip_install("hf")


def resolve(
    name_or_dir: str | Path, *, revision: str | None = None, tokenizer: bool = False
) -> Path:
    """A local folder holding the checkpoint: `name_or_dir` itself, or a hub download of it.

    Only the config, the safetensors weights (`pytorch_model.bin` and its shards when the
    repository has no safetensors) and with `tokenizer=True` the tokenizer files are downloaded.
    Offline, a copy already in the HuggingFace cache is used.
    """
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_dir)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(
            f"{name} is not a folder; pass a folder with {CONFIG} and {WEIGHTS}, or a hub name "
            "like 'gpt2' or 'Helsinki-NLP/opus-mt-de-en'"
        )
    try:
        from huggingface_hub import list_repo_files, snapshot_download
    except ImportError as error:
        raise ImportError(
            f"{name!r} is not a local folder, and downloading it needs huggingface_hub: "
            f"{INSTALL_HF}"
        ) from error
    try:
        files = list_repo_files(name, revision=revision)
    except Exception as error:
        try:  # offline: a snapshot already in the cache
            return Path(snapshot_download(name, revision=revision, local_files_only=True))
        except Exception:
            raise _unreachable(name, error, tokenizer) from error
    patterns = _weight_patterns(name, files) + (TOKENIZER_PATTERNS if tokenizer else [])
    try:
        folder = snapshot_download(name, revision=revision, allow_patterns=patterns)
    except Exception as error:
        raise _unreachable(name, error, tokenizer) from error
    return Path(folder)


def _weight_patterns(name: str, files: list[str]) -> list[str]:
    """What to download of a repository holding `files`: safetensors if it has them, else pickles."""
    if WEIGHTS in files or INDEX in files:
        return WEIGHT_PATTERNS
    if PICKLE in files or PICKLE_INDEX in files:
        return WEIGHT_PATTERNS + PICKLE_PATTERNS
    weights = [f for f in files if f.endswith((".h5", ".msgpack", ".ot", ".onnx"))]
    raise FileNotFoundError(
        f"{name} on the HuggingFace hub has neither {WEIGHTS} nor {PICKLE}"
        + (f" (only {', '.join(weights)}, which zoo does not read)" if weights else "")
        + "; pass revision= for a branch that has them, or convert the weights with transformers"
    )


def _unreachable(name: str, error: Exception, tokenizer: bool) -> OSError:
    extra = " --include '*.txt' --include '*.spm' --include '*.model'" if tokenizer else ""
    return OSError(
        f"could not get {name!r} from the HuggingFace hub ({type(error).__name__}: {error}). "
        "Offline? Download the folder where you have a connection, e.g. "
        f"`hf download {name} --include '*.json' --include '*.safetensors'{extra} "
        "--local-dir DIR` (with --include '*.bin' instead of '*.safetensors' for repositories "
        "that have no safetensors, such as Helsinki-NLP/opus-mt-*), copy it here and pass its "
        "path instead of the name"
    )


def damaged(path: Path, detail: str) -> ValueError:
    """The error for a checkpoint file that is truncated, empty or not what its name says."""
    return ValueError(
        f"{path} is damaged ({detail}); it is probably truncated or an unfinished download: "
        "delete it and download it again"
    )


def read_json(path: Path) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise damaged(path, f"not valid JSON: {error}") from None


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG}: it is not a HuggingFace checkpoint")
    config = read_json(path)
    if not isinstance(config, dict):
        raise damaged(path, f"a JSON {type(config).__name__}, not an object")
    return config


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of `model.safetensors`, or of the shards its index lists; failing those, of
    `pytorch_model.bin` or its shards (read with torch's weights-only loader)."""
    for single, index, read in (
        (folder / WEIGHTS, folder / INDEX, read_safetensors),
        (folder / PICKLE, folder / PICKLE_INDEX, _read_pickle),
    ):
        if single.is_file():
            return read(single)
        if index.is_file():
            return _read_shards(index, read)
    raise FileNotFoundError(
        f"{folder} has none of {WEIGHTS}, {INDEX}, {PICKLE} or {PICKLE_INDEX}: download the "
        "weights into it (see docs/pretrained.md)"
    )


def _read_shards(index: Path, read: Any) -> dict[str, np.ndarray]:
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise damaged(index, "no weight_map")
    arrays: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(
                f"{index} lists the shard {shard}, which is not in {index.parent}: download it"
            )
        arrays.update(read(index.parent / shard))
    return arrays


def _read_pickle(path: Path) -> dict[str, np.ndarray]:
    from zoo.interop.torch_weights import read_torch_file

    return read_torch_file(path)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except KeyError:  # a dtype numpy does not know (bfloat16)
        return _read_raw(path)
    except SafetensorError as error:
        raise damaged(path, f"safetensors: {error}") from None


_RAW_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


def _read_raw(path: Path) -> dict[str, np.ndarray]:
    """Read the safetensors layout directly: an 8-byte header size, a JSON header, the bytes."""
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_size])
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


def write_safetensors(arrays: dict[str, np.ndarray], path: Path) -> None:
    """Write `arrays` as safetensors (with transformers' "pt" format tag); bfloat16 included."""
    metadata = {"format": "pt"}
    if not any(a.dtype == ml_dtypes.bfloat16 for a in arrays.values()):
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path, metadata=metadata)
        return
    names = {np.dtype(v): k for k, v in _RAW_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": metadata}
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
