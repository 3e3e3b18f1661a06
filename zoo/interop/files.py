"""Checkpoint folders: find them (local or on the HuggingFace hub), read and write safetensors.

Weights are read with `safetensors.numpy` (never pickle, no torch needed). bfloat16 tensors,
which numpy lacks, go through `ml_dtypes` (installed with jax).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

from zoo.extras import pip_install

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
WEIGHT_PATTERNS = [CONFIG, "generation_config.json", WEIGHTS, INDEX, "model-*.safetensors"]
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

    Only the config, the safetensors weights (and with `tokenizer=True` the tokenizer files)
    are downloaded.
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
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(
            f"{name!r} is not a local folder, and downloading it needs huggingface_hub: "
            f"{INSTALL_HF}"
        ) from error
    patterns = WEIGHT_PATTERNS + (TOKENIZER_PATTERNS if tokenizer else [])
    try:
        folder = snapshot_download(name, revision=revision, allow_patterns=patterns)
    except Exception as error:
        include = " ".join(f"'{pattern}'" for pattern in patterns)
        raise OSError(
            f"could not get {name!r} from the HuggingFace hub ({type(error).__name__}: {error}). "
            f"Offline? Download the folder where you have a connection, e.g. "
            f"`huggingface-cli download {name} --include {include} --local-dir DIR`, copy it "
            "here and pass its path instead of the name"
        ) from error
    return Path(folder)


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG}: it is not a HuggingFace checkpoint")
    with open(path) as handle:
        return json.load(handle)


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of `model.safetensors`, or of the shards an index file lists."""
    single, index = folder / WEIGHTS, folder / INDEX
    if single.is_file():
        return read_safetensors(single)
    if index.is_file():
        with open(index) as handle:
            shards = sorted(set(json.load(handle)["weight_map"].values()))
        arrays: dict[str, np.ndarray] = {}
        for shard in shards:
            arrays.update(read_safetensors(folder / shard))
        return arrays
    pickles = sorted(p.name for p in folder.glob("*.bin"))
    hint = (
        f" It has {', '.join(pickles)}: zoo never unpickles weights. Convert once with "
        "transformers (`AutoModel.from_pretrained(dir).save_pretrained(dir, "
        "safe_serialization=True)`) or pass the loaded torch model to zoo.from_hf"
        if pickles
        else ""
    )
    raise FileNotFoundError(f"{folder} has no {WEIGHTS} or {INDEX}.{hint}")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except KeyError:  # a dtype numpy does not know (bfloat16)
        return _read_raw(path)


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
