"""Checkpoint folders: find them (local or on the HuggingFace hub) and read their JSON files.

The tensors in a folder are read and written by `weights.py` (safetensors, and pickled
`pytorch_model.bin` through `torch_weights.py`).
"""

from __future__ import annotations

from pathlib import Path

from zoo.extras import pip_install
from zoo.files import JSONObject, JSONValue, read_json_object
from zoo.files import damaged as damaged_file

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
# a HuggingFace `config.json` as a dict: option name -> JSON value
HFDict = dict[str, object]
# what to do about a damaged file of a checkpoint folder
DOWNLOAD_AGAIN = (
    "it is probably truncated or an unfinished download: delete it and download it again"
)


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
    return damaged_file(path, detail, DOWNLOAD_AGAIN)


def read_json(path: Path, *, missing_ok: bool = False) -> JSONObject:
    """The JSON object in a checkpoint folder's file; a damaged one says to download it again.
    With `missing_ok`, an absent (optional) file reads as `{}`."""
    return read_json_object(path, fix=DOWNLOAD_AGAIN, missing_ok=missing_ok)


def read_config(folder: Path) -> JSONObject:
    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG}: it is not a HuggingFace checkpoint")
    return read_json(path)


def json_id(value: JSONValue, name: str, path: Path) -> int | None:
    """A token id read from `path` as `name`: an integer or null; anything else (text, a
    number with a fraction, true) is reported as a damaged file."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise damaged(path, f"{name} is {value!r}, not a token id")


def json_ids(value: JSONValue, name: str, path: Path) -> list[int]:
    """The token ids read from `path` as `name`: null (none), one id or a list of them (its
    nulls left out); anything else is reported as a damaged file."""
    ids = [json_id(item, name, path) for item in (value if isinstance(value, list) else [value])]
    return [i for i in ids if i is not None]
