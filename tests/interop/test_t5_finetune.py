"""A T5 folder laid out like a hub snapshot (config, safetensors, SentencePiece `tokenizer.json`):
its tokenizer through zoo's interface equals `AutoTokenizer`, and `zoo train translator --init`
fine-tunes it on task-prefixed pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hf_helpers import torch, transformers

import zoo
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer
from zoo.interop import FastTokenizer, pretrained_tokenizer

pytestmark = pytest.mark.hf
tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers library (zoo[hf])")
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors  # noqa: E402

PREFIX = "translate German to English: "
PAIRS = [
    ("ein Hund läuft im Park", "a dog runs in the park"),
    ("zwei Männer spielen Fußball", "two men play football"),
    ("eine Frau liest ein Buch", "a woman reads a book"),
    ("Kinder spielen am Strand", "children play on the beach"),
]
SAMPLE = [PREFIX + de for de, _ in PAIRS] + [en for _, en in PAIRS] + ["Größere  Übungen, 2024!"]


def t5_folder(folder: Path) -> Path:
    """A SentencePiece Unigram tokenizer trained on SAMPLE with T5's specials and pipeline
    (Metaspace, `</s>` appended), saved by `T5TokenizerFast`, and a tiny random T5 v1.1."""
    tokenizer = tokenizers.Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = tokenizers.trainers.UnigramTrainer(
        vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tokenizer.train_from_iterator(SAMPLE * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    wrapped = transformers.T5TokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_ids=0,
    )
    wrapped.save_pretrained(folder)
    config = transformers.T5Config(
        vocab_size=FastTokenizer.from_folder(folder).vocab_size,
        d_model=16,
        d_kv=8,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(0.1 * torch.randn(config.vocab_size, 16))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return t5_folder(tmp_path_factory.mktemp("t5"))


def test_sentencepiece_tokenizer_equals_auto_tokenizer(folder):
    ours = pretrained_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert isinstance(ours, FastTokenizer)
    assert (ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2)
    assert ours.bos_id == 0  # T5's decoder start: targets begin with the pad id
    for text in [*SAMPLE, "ein  Hund, unbekannt: Zebra"]:
        ids = ours.encode(text, add_eos=True)
        assert ids == theirs(text).input_ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.encode("a dog", add_bos=True)[0] == 0


@pytest.mark.slow
def test_finetune_a_t5_folder_from_the_cli(tmp_path, capsys, folder):
    data = tmp_path / "pairs"
    data.mkdir()
    for split, copies in (("train", 8), ("validation", 1)):
        rows = [{"de": PREFIX + de, "en": en} for de, en in PAIRS] * copies
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    argv = ["train", "translator", "--init", str(folder), "--data", f"json:{data}",
            "--source", "de", "--target", "en", "--out", str(out), "--steps", "3",
            "--batch-size", "4", "--max-len", "24", "--eval-limit", "1", "--no-progress",
            "--json"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and np.isfinite(summary["eval_loss"])
    model = zoo.load(out)
    c = model.config
    assert (
        c.relative is not None,
        c.layers.block.feed_forward.kind,
        c.head.tie,
        c.bos_id,
        c.pad_id,
    ) == (
        True,
        "gated",
        False,
        0,
        0,
    )
    tokenizer = load_tokenizer(out)
    assert isinstance(tokenizer, FastTokenizer) and tokenizer.bos_id == 0
    # the fine-tuned weights moved away from the checkpoint's
    start = zoo.from_pretrained(folder)
    assert not np.allclose(model.output_proj.weight, start.output_proj.weight)
