"""Pickled PyTorch weights (`pytorch_model.bin`), read without ever running code from them.

Many hub repositories (all of `Helsinki-NLP/opus-mt-*`, older BERT and GPT-2 uploads) hold only
`pytorch_model.bin`, a pickle. A plain unpickle runs whatever code the file names, so zoo reads
these files only through `torch.load(weights_only=True)`, whose restricted unpickler accepts
tensors and plain containers and refuses everything else. torch before 2.6 had a hole in that
mode (CVE-2025-32434), so older torch is refused. safetensors files never reach this module.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np

from zoo.interop.files import CONFIG, INSTALL_HF, damaged, read_json

MIN_TORCH = (2, 6)  # the first torch whose weights-only unpickler runs no code


def read_torch_file(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a `torch.save`d state dict, as numpy arrays (bfloat16 via ml_dtypes).

    Raises `ValueError` for a file that would run code or holds anything but tensors, and for a
    damaged file; `ImportError` (saying what to install) without torch >= 2.6.
    """
    torch = _import_torch(path)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise _refusal(path, str(error)) from None
    except (EOFError, RuntimeError, OSError) as error:  # a truncated zip or pickle
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise damaged(path, f"torch.load: {detail}") from None
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a state dict (a mapping of names to "
            "tensors as torch.save(model.state_dict()) writes it)"
        )
    return state_dict_to_numpy(state, what=str(path))


def state_dict_to_numpy(state: Mapping[str, object], *, what: str) -> dict[str, np.ndarray]:
    """A torch state dict as numpy arrays; bfloat16 stays bfloat16 (`ml_dtypes`), as in safetensors."""
    import torch

    arrays = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"{what}: {name!r} holds a {type(tensor).__name__}, not a tensor; zoo reads "
                "state dicts of tensors only"
            )
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            arrays[name] = tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            arrays[name] = tensor.numpy()
    return arrays


def _import_torch(path: Path) -> ModuleType:
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"{path} holds pickled PyTorch weights, which zoo reads only through "
            f"torch.load(weights_only=True): install torch >= 2.6 with {INSTALL_HF}. "
            f"Or, where torch is installed, {conversion_advice(path.parent)}"
        ) from None
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if match is None or (int(match[1]), int(match[2])) < MIN_TORCH:
        raise ImportError(
            f"torch {torch.__version__} is too old to read {path} safely: before torch 2.6, "
            "torch.load(weights_only=True) could still run code from a crafted file. Upgrade "
            "with pip install 'torch>=2.6'"
        )
    return torch


def _refusal(path: Path, message: str) -> ValueError:
    """torch's weights-only unpickler rejected the file: say whether it would have run code."""
    called = re.search(r"GLOBAL (\S+)", message)
    if called:
        return ValueError(
            f"{path} would run code when unpickled (it calls {called[1]}): zoo refused it and "
            "ran nothing. torch.load(weights_only=True) reads only tensors. Do not load this "
            "file; get the weights from a source you trust, preferably as model.safetensors"
        )
    reason = next((line for line in message.splitlines() if "Unsupported" in line), "")
    return damaged(path, f"not a torch state dict of tensors: {reason or 'unreadable pickle'}")


def conversion_advice(folder: Path) -> str:
    """How to turn `folder` into safetensors with transformers, naming the class that keeps heads."""
    try:
        classes = read_json(folder / CONFIG).get("architectures")
    except (OSError, ValueError):
        classes = None
    if isinstance(classes, list) and classes and isinstance(classes[0], str):
        cls = f"transformers.{classes[0]}"
        why = f"the class in its {CONFIG} `architectures`"
    else:
        cls, why = "transformers.<TaskClass>", "the task class it was trained as"
    return (
        f"convert the folder to safetensors once: `{cls}.from_pretrained(DIR)"
        f".save_pretrained(DIR)` ({why}; AutoModel would drop task heads such as Marian's "
        "final_logits_bias or a classifier, and the logits would silently change)"
    )
