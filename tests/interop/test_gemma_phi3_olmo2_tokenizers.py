"""Gemma, Phi-3 and OLMo 2 tokenizer folders, as their hub snapshots ship `tokenizer.json`.

Gemma's file is a BPE over `▁`-joined words with byte fallback and no prefix space, `<bos>`
added by its post-processor, `<pad>`, `<eos>`, `<bos>` and `<unk>` at ids 0-3; Phi-3's is
Llama 2's (a `▁` prepended, byte fallback, `<s>`); OLMo 2's is a byte-level BPE. `zoo.interop.pretrained_tokenizer` reads each as the file says: the same ids as
transformers' `PreTrainedTokenizerFast` on multilingual text, with and without `<bos>`.
"""

from __future__ import annotations

import json

import pytest
from fast_tokenizer_folders import (
    SAMPLE,
    _add_specials,
    _added_tokens_decoder,
    mistral_folder,
    qwen_folder,
)

from zoo.interop import FastTokenizer, pretrained_tokenizer

tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers library (zoo[hf])")
from tokenizers import decoders, models, normalizers, processors, trainers  # noqa: E402

GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def gemma_folder(folder):
    normalizer = normalizers.Replace(" ", "▁")  # no dummy prefix, unlike Llama 2
    trainer_tokenizer = tokenizers.Tokenizer(models.BPE())
    trainer_tokenizer.normalizer = normalizer
    trainer_tokenizer.train_from_iterator(
        [SAMPLE[0], SAMPLE[1], SAMPLE[5]] * 3, trainers.BpeTrainer(vocab_size=150)
    )
    trained = json.loads(trainer_tokenizer.to_str())["model"]
    pieces = [*GEMMA_SPECIALS, *(f"<0x{byte:02X}>" for byte in range(256))]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    for piece, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ") if isinstance(m, str) else m) for m in trained["merges"]]
    model = models.BPE(
        vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    ids = _add_specials(tokenizer, GEMMA_SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", ids["<bos>"])]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    files = {
        "tokenizer_config.json": {
            "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": _added_tokens_decoder(ids),
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "tokenizer_class": "GemmaTokenizer",
        },
        "config.json": {
            "model_type": "gemma3_text",
            "bos_token_id": 2,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    return folder


@pytest.mark.hf
@pytest.mark.parametrize("model_type", ["gemma3_text", "gemma2"])
def test_a_gemma_tokenizer_json_gives_transformers_ids(tmp_path, model_type):
    transformers = pytest.importorskip("transformers")
    folder = gemma_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type=model_type)))
    ours = pretrained_tokenizer(folder)
    assert isinstance(ours, FastTokenizer)
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<bos>", eos_token="<eos>"
    )
    for text in SAMPLE:
        expected = reference(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == expected, text
        assert ours.encode(text, add_bos=True) == reference(text)["input_ids"]
        assert ours.decode(expected) == reference.decode(expected)
    assert (ours.bos_id, ours.unk_id) == (2, 3)
    assert any(
        f"<0x{byte:02X}>" in reference.convert_ids_to_tokens(ours.encode("我们"))
        for byte in (0xE6,)
    )


def test_an_olmo2_folder_reads_its_byte_level_tokenizer_json(tmp_path):
    qwen_folder(tmp_path, model_type="olmo2")  # a byte-level BPE, as OLMo 2's is
    assert isinstance(pretrained_tokenizer(tmp_path), FastTokenizer)


@pytest.mark.hf
def test_a_phi3_folder_reads_its_llama2_style_tokenizer_json(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = mistral_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="phi3")))
    ours = pretrained_tokenizer(folder)
    assert isinstance(ours, FastTokenizer)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    for text in SAMPLE:
        assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text
