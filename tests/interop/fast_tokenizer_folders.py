"""Tiny tokenizer folders laid out like the hub snapshots of Llama 3, Qwen2.5, Mistral, SmolLM2.

Each trains a small BPE with the tokenizers library on `SAMPLE` (no network) and writes
`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`, `generation_config.json`
and `config.json` as those repositories have them. The normalizers, pre-tokenizers, decoders and
post-processors are the real checkpoints' own.
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

SAMPLE = [
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "Größere Übungen für Bäcker: Ärger, Öl und süße Straße.",
    "我们今天去公园散步，天气很好。",
    "Emoji time 🎉🦊👍🏽 and a family 👨‍👩‍👧!",
    "مرحبا بالعالم، كيف حالك؟",
    "def f(x):\n\treturn x  *  2\n\n\tif x:\n        pass  # a tab\tand spaces",
]
# Llama 3's and Qwen2's pre-tokenizer patterns (they differ in how digits are grouped).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>"]


def _byte_level(split: str, *, nfc: bool = False) -> Any:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer.train_from_iterator(
        SAMPLE * 3, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet)
    )
    return tokenizer


def _add_specials(tokenizer: Any, specials: list[str]) -> dict[str, int]:
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return {s: tokenizer.token_to_id(s) for s in specials}


def _added_tokens_decoder(ids: dict[str, int]) -> dict[str, Any]:
    flags = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    return {str(i): {"content": text, **flags} for text, i in ids.items()}


def _write(folder: Path, tokenizer: Any, files: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False))
    return folder


def llama3_folder(folder: Path) -> Path:
    """Llama 3.1 instruct: bos from the post-processor, eos `<|eot_id|>`, three stop ids."""
    tokenizer = _byte_level(LLAMA3_SPLIT)
    ids = _add_specials(tokenizer, LLAMA3_SPECIALS)
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
    stops = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
    marker = dict(lstrip=False, normalized=False, rstrip=False, single_word=False)
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": {
                "added_tokens_decoder": _added_tokens_decoder(ids),
                "bos_token": "<|begin_of_text|>",
                "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
                "clean_up_tokenization_spaces": True,
                "eos_token": "<|eot_id|>",
                "model_input_names": ["input_ids", "attention_mask"],
                "model_max_length": 131072,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            "special_tokens_map.json": {
                "bos_token": {"content": "<|begin_of_text|>", **marker},
                "eos_token": {"content": "<|eot_id|>", **marker},
            },
            "generation_config.json": {
                "bos_token_id": bos,
                "do_sample": True,
                "eos_token_id": stops,
                "temperature": 0.6,
                "top_p": 0.9,
            },
            "config.json": {
                "model_type": "llama",
                "bos_token_id": bos,
                "eos_token_id": stops,
                "vocab_size": tokenizer.get_vocab_size(),
            },
        },
    )


def qwen_folder(folder: Path, model_type: str = "qwen2") -> Path:
    """Qwen2.5 instruct: no bos, eos `<|im_end|>`, pad `<|endoftext|>`, NFC normalizer."""
    tokenizer = _byte_level(QWEN_SPLIT, nfc=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    ids = _add_specials(tokenizer, QWEN_SPECIALS)
    end, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": {
                "add_prefix_space": False,
                "added_tokens_decoder": _added_tokens_decoder(ids),
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "errors": "replace",
                "pad_token": "<|endoftext|>",
                "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer",
                "unk_token": None,
            },
            "special_tokens_map.json": {
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False},
                "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False},
            },
            "generation_config.json": {
                "bos_token_id": end,
                "eos_token_id": [im_end, end],
                "pad_token_id": end,
                "do_sample": True,
            },
            "config.json": {
                "model_type": model_type,
                "bos_token_id": end,
                "eos_token_id": im_end,
                "vocab_size": 512,  # Qwen pads its embedding past the tokenizer
            },
        },
    )


def mistral_folder(folder: Path, *, metaspace: bool = False) -> Path:
    """Mistral 7B / Llama 2: SentencePiece-converted BPE with byte fallback, `<s>` added.

    The legacy layout (`metaspace=False`, Mistral v0.1 and Llama 2) prepends `▁` in the
    normalizer; newer files (Mistral v0.3) use a Metaspace pre-tokenizer instead. Ids 3-258 are
    the byte tokens `<0x00>`..`<0xFF>`; characters the merges lack (Chinese, emoji, Arabic here)
    fall back to them.
    """
    if metaspace:
        normalizer = None
        pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False
        )
    else:
        normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        pre_tokenizer = None
    trainer_tokenizer = tokenizers.Tokenizer(models.BPE())
    trainer_tokenizer.normalizer, trainer_tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    latin = [SAMPLE[0], SAMPLE[1], SAMPLE[5]]
    trainer_tokenizer.train_from_iterator(latin * 3, trainers.BpeTrainer(vocab_size=150))
    trained = json.loads(trainer_tokenizer.to_str())["model"]
    pieces = [*MISTRAL_SPECIALS, *(f"<0x{byte:02X}>" for byte in range(256))]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    for piece, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    # tokenizers < 0.20 wrote a merge as "a b", later versions as ["a", "b"]
    merges = [tuple(m.split(" ") if isinstance(m, str) else m) for m in trained["merges"]]
    model = models.BPE(
        vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    ids = _add_specials(tokenizer, MISTRAL_SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", ids["<s>"])]
    )
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": {
                "add_bos_token": True,
                "add_eos_token": False,
                "added_tokens_decoder": _added_tokens_decoder(ids),
                "bos_token": "<s>",
                "eos_token": "</s>",
                "legacy": not metaspace,
                "pad_token": None,
                "sp_model_kwargs": {},
                "spaces_between_special_tokens": False,
                "tokenizer_class": "LlamaTokenizer",
                "unk_token": "<unk>",
                "use_default_system_prompt": False,
            },
            "special_tokens_map.json": {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
            },
            "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2},
            "config.json": {
                "model_type": "mistral",
                "bos_token_id": 1,
                "eos_token_id": 2,
                "vocab_size": tokenizer.get_vocab_size(),
            },
        },
    )


def smollm2_folder(folder: Path) -> Path:
    """SmolLM2 instruct (model_type llama): its specials are ids 0-2, digits split one by one.

    Its `tokenizer_class` is GPT2Tokenizer, which transformers 5 rebuilds with GPT-2's own
    pre-tokenizer, dropping the `Digits` step of `tokenizer.json` (huggingface/transformers#45812):
    `PreTrainedTokenizerFast`, which reads the file as it is, is the reference here.
    """
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=QWEN_SPECIALS,
    )
    tokenizer.train_from_iterator(SAMPLE * 3, trainer)
    ids = {text: tokenizer.token_to_id(text) for text in QWEN_SPECIALS}  # 0, 1, 2
    return _write(
        folder,
        tokenizer,
        {
            "tokenizer_config.json": {
                "add_prefix_space": False,
                "added_tokens_decoder": _added_tokens_decoder(ids),
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                "bos_token": "<|im_start|>",
                "clean_up_tokenization_spaces": False,
                "eos_token": "<|im_end|>",
                "model_max_length": 8192,
                "pad_token": "<|im_end|>",
                "tokenizer_class": "GPT2Tokenizer",
                "unk_token": "<|endoftext|>",
                "vocab_size": 49152,
            },
            "special_tokens_map.json": {
                "bos_token": {"content": "<|im_start|>", "lstrip": False, "normalized": False},
                "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False},
                "pad_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False},
                "unk_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False},
            },
            "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2},
            "config.json": {
                "model_type": "llama",
                "bos_token_id": 1,
                "eos_token_id": 2,
                "vocab_size": 400,
            },
        },
    )


FOLDERS = {
    "llama3": llama3_folder,
    "qwen2": qwen_folder,
    "mistral": mistral_folder,
    "mistral-metaspace": lambda folder: mistral_folder(folder, metaspace=True),
    "smollm2": smollm2_folder,
}
# Families whose tokenizer.json transformers 5's AutoTokenizer does not follow (see smollm2_folder).
READ_AS_IS = {"smollm2"}
