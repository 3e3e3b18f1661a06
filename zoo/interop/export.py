"""zoo models -> HuggingFace: a state dict and config transformers loads, or a checkpoint folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from zoo.data.tokenizers.base import Tokenizer
from zoo.files import folder_written_whole, write_text_atomic
from zoo.interop.architecture import UnsupportedExport, ZooModel
from zoo.interop.architectures import architecture_for
from zoo.interop.architectures.moe import MoEFamily
from zoo.interop.convert import zoo_to_hf
from zoo.interop.files import CONFIG, INDEX, INSTALL_HF, WEIGHTS, HFDict
from zoo.interop.tokenizers.generation_config import save_tokenizer_files
from zoo.interop.weights import write_safetensors
from zoo.interop.zoo_keys import zoo_state

if TYPE_CHECKING:  # optional dependencies, imported by `to_hf` where it runs
    import torch
    import transformers


def to_state_dict(model: ZooModel, *, full: bool = True) -> tuple[dict[str, np.ndarray], HFDict]:
    """`(numpy state dict, config.json dict)` of the transformers model matching `model`.

    GPT -> `GPT2LMHeadModel`, Classifier -> `BertForSequenceClassification`, Translator ->
    `MarianMTModel`. `full=True` includes tied copies and fixed tables, exactly the keys of the
    torch model's `state_dict()`; `full=False` leaves them out, as `save_pretrained` does.
    Needs neither torch nor transformers.
    """
    arch = architecture_for(model)
    check_score_head(model.config, arch)
    hf_config = arch.hf_config(model.config)
    key_map = arch.key_map(model.config)
    arrays = zoo_to_hf(zoo_state(model), key_map, aliases=full, derived=full)
    return arrays, hf_config


def check_score_head(config: object, arch: object) -> None:
    """Refuse a GPT's score head where its family has no `*ForSequenceClassification` mapped
    (it would be left out without a word)."""
    head = getattr(config, "head", None)
    scores = getattr(head, "scores", 0)
    if scores and not getattr(arch, "exports_scores", False):
        raise UnsupportedExport(
            f"zoo exports a score head (head.scores={scores}) as Llama, Mistral, Qwen2 or Qwen3 "
            f"*ForSequenceClassification only; this model exports as "
            f"{getattr(arch, 'export_class', '?')}"
        )


def to_hf(model: ZooModel) -> tuple[dict[str, torch.Tensor], transformers.PretrainedConfig]:
    """`(state_dict, config)`: torch tensors and a transformers config for `model`.

    `transformers.GPT2LMHeadModel(config).load_state_dict(state_dict)` (or the matching BERT or
    Marian class: `config.architectures[0]`) then computes what `model` computes. A mixture of
    experts comes in the layout of the installed transformers: one tensor per projection for
    all of a layer's experts in transformers 5 (`mlp.experts.gate_up_proj`, `down_proj`), one
    per expert before it (what `save_hf` writes either way).
    """
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            f"to_hf builds torch tensors and a transformers config: {INSTALL_HF}"
        ) from error
    arch = architecture_for(model)
    arrays, _ = to_state_dict(model, full=True)
    if isinstance(arch, MoEFamily) and int(transformers.__version__.split(".")[0]) >= 5:
        arrays = arch.fused_keys(arrays)  # transformers 5 holds each layer's experts fused
    config = arch.transformers_config(transformers, model.config)
    tensors: dict[int, torch.Tensor] = {}  # tied copies share one tensor, as in the torch model

    def tensor(array: np.ndarray) -> torch.Tensor:
        if id(array) not in tensors:
            if array.dtype == ml_dtypes.bfloat16:
                tensors[id(array)] = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
            else:
                tensors[id(array)] = torch.from_numpy(np.array(array))
        return tensors[id(array)]

    return {name: tensor(array) for name, array in arrays.items()}, config


DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' save_pretrained default
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string like "5GB", "500MB" or "2GiB" (transformers' units)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        text = size.strip().upper().replace(" ", "")
        for unit in sorted(_UNITS, key=len, reverse=True):
            if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
                return int(float(text[: -len(unit)]) * _UNITS[unit])
    raise ValueError(
        f"max_shard_size must be a positive number of bytes or a size like '5GB' or '500MB', "
        f"got {size!r}"
    )


def plan_shards(arrays: dict[str, np.ndarray], max_bytes: int) -> list[list[str]]:
    """Group tensor names into shards of at most `max_bytes` (a larger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name in arrays:
        size = arrays[name].nbytes
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def save_hf(
    model: ZooModel,
    directory: str | Path,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write `config.json` and the weights as `transformers` (and zoo) load them.

    Weights up to `max_shard_size` go into `model.safetensors`; a larger model is split into
    `model-00001-of-0000N.safetensors` shards listed by `model.safetensors.index.json`, as
    `save_pretrained` does. With `tokenizer`, its files go beside the weights (a
    `FastTokenizer`'s `tokenizer.json` and chat template, which `AutoTokenizer` reads), and a
    GPT's `generation_config.json` names every id that ends a reply
    (`zoo.interop.tokenizers.generation_config`). Needs neither torch nor transformers.

    The files are written in a hidden folder beside `directory` and moved into it at the end
    (`zoo.files.folder_written_whole`): an error or Ctrl-C on the way leaves `directory` as it
    was. Other files already in `directory` stay; weights of an earlier save there are removed.
    """
    max_bytes = parse_size(max_shard_size)
    directory = Path(directory)
    arrays, hf_config = to_state_dict(model, full=False)  # refusals: before anything is written
    hf_config = {**hf_config, "dtype": model.config.dtype}
    # written beside `directory` and moved into it at the end: an interrupted save leaves no
    # folder that looks complete, and config.json, which makes it a checkpoint, comes last
    with folder_written_whole(directory, last=(CONFIG,)) as staging:
        if tokenizer is not None:
            save_tokenizer_files(model, tokenizer, staging)
        write_text_atomic(staging / CONFIG, json.dumps(hf_config, indent=2, sort_keys=True))
        _write_weights(arrays, staging, max_bytes)
        if directory.is_dir():  # a previous save must not leave weights beside these
            for stale in [directory / WEIGHTS, directory / INDEX,
                          *directory.glob("model-*.safetensors")]:  # fmt: skip
                stale.unlink(missing_ok=True)
    return directory


def _write_weights(arrays: dict[str, np.ndarray], directory: Path, max_bytes: int) -> None:
    """`model.safetensors`, or shards of at most `max_bytes` listed by their index."""
    shards = plan_shards(arrays, max_bytes)
    if len(shards) == 1:
        write_safetensors(arrays, directory / WEIGHTS)
        return
    weight_map = {}
    for number, names in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors({name: arrays[name] for name in names}, directory / filename)
        weight_map.update(dict.fromkeys(names, filename))
    total = sum(array.nbytes for array in arrays.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    write_text_atomic(directory / INDEX, json.dumps(index, indent=2, sort_keys=True))
