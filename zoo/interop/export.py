"""zoo models -> HuggingFace: a state dict and config transformers loads, or a checkpoint folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from zoo.interop.convert import zoo_to_hf
from zoo.interop.files import CONFIG, INSTALL_HF, WEIGHTS, write_safetensors
from zoo.interop.loading import architecture_for
from zoo.interop.zoo_keys import zoo_state


def to_state_dict(model: Any, *, full: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """`(numpy state dict, config.json dict)` of the transformers model matching `model`.

    GPT -> `GPT2LMHeadModel`, Classifier -> `BertForSequenceClassification`, Translator ->
    `MarianMTModel`. `full=True` includes tied copies and fixed tables, exactly the keys of the
    torch model's `state_dict()`; `full=False` leaves them out, as `save_pretrained` does.
    Needs neither torch nor transformers.
    """
    arch = architecture_for(model)
    hf_config = arch.hf_config(model.config)
    key_map = arch.key_map(model.config)
    arrays = zoo_to_hf(zoo_state(model), key_map, aliases=full, derived=full)
    return arrays, hf_config


def to_hf(model: Any) -> tuple[dict[str, Any], Any]:
    """`(state_dict, config)`: torch tensors and a transformers config for `model`.

    `transformers.GPT2LMHeadModel(config).load_state_dict(state_dict)` (or the matching BERT or
    Marian class: `config.architectures[0]`) then computes what `model` computes.
    """
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            f"to_hf builds torch tensors and a transformers config: {INSTALL_HF}"
        ) from error
    arrays, hf_config = to_state_dict(model, full=True)
    arch = architecture_for(model)
    fields = {k: v for k, v in hf_config.items() if k != "model_type"}
    config = getattr(transformers, arch.config_class)(**fields)
    tensors: dict[int, Any] = {}  # tied copies share one tensor, as in the torch model

    def tensor(array: np.ndarray) -> Any:
        if id(array) not in tensors:
            if array.dtype == ml_dtypes.bfloat16:
                tensors[id(array)] = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
            else:
                tensors[id(array)] = torch.from_numpy(np.array(array))
        return tensors[id(array)]

    return {name: tensor(array) for name, array in arrays.items()}, config


def save_hf(model: Any, directory: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` that `transformers` (and zoo) load.

    Needs neither torch nor transformers.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays, hf_config = to_state_dict(model, full=False)
    hf_config = {**hf_config, "dtype": model.config.dtype}
    with open(directory / CONFIG, "w") as handle:
        json.dump(hf_config, handle, indent=2, sort_keys=True)
    write_safetensors(arrays, directory / WEIGHTS)
    return directory
