"""Load the model a command works on: a `zoo train` run directory, or `hf:NAME` / an HF folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.models import flavor_of
from zoo.serialize import is_zoo_folder, load_with_tokenizer


def load_model(spec: str, flavor: str | None = None, adapter: str | None = None) -> tuple[Any, Any]:
    """`(model, tokenizer)` from a saved zoo model directory, `hf:NAME` or a HF checkpoint folder.

    `adapter` is a PEFT LoRA adapter folder put on the model (`zoo.lora.load_adapter`). Raises if
    the model is not of `flavor` (when given) or comes without a tokenizer.
    """
    if spec.startswith("hf:"):
        from zoo.interop import from_pretrained

        model, tokenizer = from_pretrained(spec[3:], return_tokenizer=True)
    else:
        path = Path(spec)
        config = path / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"{spec} is not a model directory (no config.json): pass the --out directory of "
                "`zoo train`, or hf:NAME for a HuggingFace checkpoint"
            )
        if is_zoo_folder(path):
            model, tokenizer = load_with_tokenizer(path)
        else:
            from zoo.interop import from_pretrained

            model, tokenizer = from_pretrained(path, return_tokenizer=True)
    if adapter is not None:
        from zoo.lora import load_adapter

        model = load_adapter(model, adapter)
    found = flavor_of(model)
    if flavor is not None and found != flavor:
        raise ValueError(f"{spec} holds a {found} model; this command needs a {flavor}")
    if tokenizer is None:
        raise FileNotFoundError(
            f"{spec} has no saved tokenizer, so text cannot be encoded; save the model with "
            "zoo.save(model, dir, tokenizer=...)"
        )
    return model, tokenizer
