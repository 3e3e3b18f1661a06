"""Tiny tokenizer folders laid out like the hub snapshots of instruct models, with their real
chat templates (chat_templates/README.md says where each template text comes from).

| family | hub snapshot | template file (chat_templates/) |
| --- | --- | --- |
| `qwen2.5` | Qwen/Qwen2.5-0.5B-Instruct | `qwen2.5-instruct.jinja` |
| `llama-3.2` | meta-llama/Llama-3.2-1B-Instruct | `llama-3.2-instruct.jinja` |
| `smollm2` | HuggingFaceTB/SmolLM2-135M-Instruct | `smollm2-instruct.jinja` |
| `llama-3.1` | meta-llama/Llama-3.1-8B-Instruct | `llama-3.1-8b-instruct.jinja` |
| `qwen1.5` | Qwen/Qwen1.5-0.5B-Chat | `qwen1.5-chat.jinja` |
| `phi-3` | microsoft/Phi-3-mini-4k-instruct | `phi-3-mini-4k-instruct.jinja` |
| `phi-3.5` | microsoft/Phi-3.5-mini-instruct | `phi-3.5-mini-instruct.jinja` |
| `gemma-2` | google/gemma-2-2b-it | `gemma-2-2b-it.jinja` |
| `gemma-3` | google/gemma-3-1b-it | `gemma-3-it.jinja` |
| `zephyr` | HuggingFaceH4/zephyr-7b-beta | `zephyr-7b-beta.jinja` |
| `mistral-v0.3` | mistralai/Mistral-7B-Instruct-v0.3 | `mistral-7b-instruct-v0.3.jinja` |

The first three carry their families' tokenizer layouts in full (below); the others
(`SPECS`) are byte-level BPE folders read as `PreTrainedTokenizerFast` with the family's
special tokens, bos/eos/pad and stop ids: what a template and its assistant mask depend on.

The templates are the checkpoints' `chat_template` text, byte for byte (Qwen2.5 and Llama 3.2
as llama.cpp's models/templates/ fetched them from the hub with scripts/get_chat_template.py;
SmolLM2's as its tokenizer_config.json holds it). Each tokenizer is a small byte-level BPE
trained here on `SAMPLE` (no network) with the family's pre-tokenizer and its real special
tokens; `tokenizer_config.json`, `special_tokens_map.json`, `generation_config.json` and
`config.json` (its token ids and model type only) carry the values of the real files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers library (zoo[hf])")
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

TEMPLATES = Path(__file__).parent / "chat_templates"
SAMPLE = [
    "You are a helpful assistant. Hello, how are you? I'm doing great, thank you!",
    "What is 2 + 2? It is 4. Tell me a joke about cats and dogs.",
    "Why did the cat sit on the computer? To keep an eye on the mouse.",
    "Größe, Übung: süße Straße. Cutting Knowledge Date: December 2023",
]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3 = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
]


def template(name: str) -> str:
    """The chat template text of `chat_templates/NAME.jinja`."""
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _trained(pre_tokenizer: Any, *, normalizer: Any = None, specials: list[str] = ()) -> Any:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(specials),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SAMPLE * 3, trainer)
    return tokenizer


def _split_then_bytes(pattern: str) -> Any:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_specials(tokenizer: Any, specials: list[str]) -> dict[str, int]:
    """The specials appended after the vocabulary, as Qwen's and Llama's files have them."""
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return {s: tokenizer.token_to_id(s) for s in specials}


def _write(folder: Path, tokenizer: Any, files: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False))
    return folder


def qwen25_folder(folder: Path) -> Path:
    """Qwen2.5-0.5B-Instruct: no bos, eos `<|im_end|>`, pad `<|endoftext|>`, two stop ids."""
    tokenizer = _trained(_split_then_bytes(QWEN_SPLIT), normalizer=normalizers.NFC())
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    ids = _add_specials(tokenizer, CHATML)
    end, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    config = {
        "add_prefix_space": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": template("qwen2.5-instruct"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    generation = {"bos_token_id": end, "pad_token_id": end, "eos_token_id": [im_end, end]}
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": config,
            "generation_config.json": {**generation, "top_k": 20},
            "config.json": {"model_type": "qwen2", "bos_token_id": end, "eos_token_id": im_end},
        },
    )


def llama32_folder(folder: Path) -> Path:
    """Llama-3.2-1B-Instruct: bos from the post-processor, eos `<|eot_id|>`, three stop ids."""
    tokenizer = _trained(_split_then_bytes(LLAMA3_SPLIT))
    ids = _add_specials(tokenizer, LLAMA3)
    bos = ids["<|begin_of_text|>"]
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    marker = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    stops = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
    config = {
        "bos_token": "<|begin_of_text|>",
        "chat_template": template("llama-3.2-instruct"),
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    special_map = {
        "bos_token": {"content": "<|begin_of_text|>", **marker},
        "eos_token": {"content": "<|eot_id|>", **marker},
    }
    generation = {"bos_token_id": bos, "do_sample": True, "eos_token_id": stops}
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": config,
            "special_tokens_map.json": special_map,
            "generation_config.json": {**generation, "temperature": 0.6, "top_p": 0.9},
            "config.json": {"model_type": "llama", "bos_token_id": bos, "eos_token_id": stops},
        },
    )


def smollm2_folder(folder: Path) -> Path:
    """SmolLM2-135M-Instruct: specials are ids 0-2, digits split one by one, eos `<|im_end|>`."""
    digits_then_bytes = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer = _trained(digits_then_bytes, specials=CHATML)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    marker = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    config = {
        "add_prefix_space": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>",
        "chat_template": template("smollm2-instruct"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 8192,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
        "vocab_size": 49152,
    }
    special_map = {
        f"{role}_token": {"content": text, **marker}
        for role, text in [
            ("bos", "<|im_start|>"),
            ("eos", "<|im_end|>"),
            ("pad", "<|im_end|>"),
            ("unk", "<|endoftext|>"),
        ]
    }
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": config,
            "special_tokens_map.json": special_map,
            "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2},
            "config.json": {"model_type": "llama", "bos_token_id": 1, "eos_token_id": 2},
        },
    )


# family -> (template, special tokens in id order, bos, eos, pad, stop tokens of generation)
SPECS: dict[str, tuple[str, list[str], str | None, str, str | None, list[str]]] = {
    "llama-3.1": ("llama-3.1-8b-instruct", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", None,
                  ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
    "qwen1.5": ("qwen1.5-chat", CHATML, None, "<|im_end|>", "<|endoftext|>",
                ["<|im_end|>", "<|endoftext|>"]),
    "phi-3": ("phi-3-mini-4k-instruct",
              ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>",
               "<|user|>"],
              "<s>", "<|endoftext|>", "<|endoftext|>", ["<|endoftext|>", "<|assistant|>", "<|end|>"]),
    "phi-3.5": ("phi-3.5-mini-instruct",
                ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>",
                 "<|end|>", "<|user|>"],
                "<s>", "<|endoftext|>", "<|endoftext|>", ["<|end|>", "<|assistant|>", "<|endoftext|>"]),
    "gemma-2": ("gemma-2-2b-it", ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                                  "<end_of_turn>"],
                "<bos>", "<eos>", "<pad>", ["<eos>", "<end_of_turn>"]),
    "gemma-3": ("gemma-3-it", ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                               "<end_of_turn>"],
                "<bos>", "<eos>", "<pad>", ["<eos>", "<end_of_turn>"]),
    "zephyr": ("zephyr-7b-beta", ["<unk>", "<s>", "</s>"], "<s>", "</s>", "</s>", ["</s>"]),
    "mistral-v0.3": ("mistral-7b-instruct-v0.3",
                     ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                      "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                      "[/TOOL_RESULTS]"],
                     "<s>", "</s>", None, ["</s>"]),
}  # fmt: skip


def spec_folder(family: str, folder: Path) -> Path:
    """The `SPECS` folder of `family`: its special tokens first (ids 0, 1, ...), read as
    `PreTrainedTokenizerFast`."""
    name, specials, bos, eos, pad, stops = SPECS[family]
    tokenizer = _trained(_split_then_bytes(LLAMA3_SPLIT), specials=specials)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    ids = {text: tokenizer.token_to_id(text) for text in specials}
    config = {
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": "<unk>" if "<unk>" in specials else None,
        "chat_template": template(name),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    stop_ids = [ids[text] for text in stops]
    generation = {"eos_token_id": stop_ids if len(stop_ids) > 1 else stop_ids[0]}
    if bos is not None:
        generation["bos_token_id"] = ids[bos]
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": config,
            "generation_config.json": generation,
            "config.json": {"model_type": "llama", "eos_token_id": generation["eos_token_id"]},
        },
    )


FOLDERS = {"qwen2.5": qwen25_folder, "llama-3.2": llama32_folder, "smollm2": smollm2_folder}
# Every family, the SPECS ones built by `spec_folder`.
ALL_FOLDERS = {
    **FOLDERS,
    **{family: (lambda folder, family=family: spec_folder(family, folder)) for family in SPECS},
}
# SmolLM2's tokenizer_class is GPT2Tokenizer, which transformers 5 rebuilds with GPT-2's own
# pre-tokenizer, dropping the Digits step of tokenizer.json (see tests/interop's
# fast_tokenizer_folders.py): PreTrainedTokenizerFast, which reads the file as it is, is the
# reference for it.
READ_AS_IS = {"smollm2", *SPECS}
