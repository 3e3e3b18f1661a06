"""What an exported model's tokenizer files and `generation_config.json` tell transformers.

`save_hf(model, dir, tokenizer=...)` writes the tokenizer next to the weights (for a
`FastTokenizer`: `tokenizer.json`, `tokenizer_config.json` and the chat template, which
`AutoTokenizer` reads) and, for a GPT, `generation_config.json` with the ids `generate` stops
at: the model's `end_ids`, the tokenizer's stop ids and the tokens its chat template ends an
assistant turn with, so `apply_chat_template` + `generate` stop where `zoo.chat` stops.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TypedDict

import equinox as eqx

from zoo.data.tokenizers.base import Tokenizer
from zoo.files import write_text_atomic
from zoo.models.gpt import GPT

GENERATION_CONFIG = "generation_config.json"

logger = logging.getLogger("zoo.interop")


class GenerationConfig(TypedDict, total=False):
    """What zoo writes in `generation_config.json` (each id only where the model has one)."""

    bos_token_id: int
    eos_token_id: int | list[int]  # one id, or every id that ends a reply
    pad_token_id: int
    do_sample: bool


def stop_ids(model: GPT, tokenizer: Tokenizer | None) -> list[int]:
    """Every id that ends a reply: the model's end ids, the tokenizer's, its template's end of
    turn (when the template renders here: jinja2 is installed)."""
    ids = [*model.config.end_ids]
    if tokenizer is not None:
        ids += tokenizer.eos_ids
        try:
            from zoo.data.chat.tokens import end_of_turn_ids

            ids += end_of_turn_ids(tokenizer)
        except (ImportError, ValueError) as error:  # no jinja2, a template that cannot render
            logger.info("the chat template's end of turn is not exported: %s", error)
    vocab = model.config.vocab_size
    return [i for i in dict.fromkeys(ids) if 0 <= i < vocab]


def generation_config(model: GPT, tokenizer: Tokenizer | None = None) -> GenerationConfig:
    """The `generation_config.json` of an exported GPT (greedy by default, as zoo decodes)."""
    config = GenerationConfig(do_sample=False)
    if model.config.bos_id is not None:
        config["bos_token_id"] = model.config.bos_id
    ends = stop_ids(model, tokenizer)
    if ends:
        config["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    if model.config.pad_id is not None:
        config["pad_token_id"] = model.config.pad_id
    return config


def save_tokenizer_files(model: eqx.Module, tokenizer: Tokenizer, directory: Path) -> None:
    """The tokenizer beside exported weights, and a GPT's `generation_config.json`."""
    tokenizer.save(directory)
    if isinstance(model, GPT):
        text = json.dumps(generation_config(model, tokenizer), indent=2, sort_keys=True)
        write_text_atomic(directory / GENERATION_CONFIG, text)
