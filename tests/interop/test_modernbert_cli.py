"""`zoo classify` and `zoo train classifier --init` on a ModernBERT folder laid out like a hub
snapshot (config.json, safetensors, tokenizer.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_helpers import randomize, torch, transformers
from test_modernbert_parity import global_layers
from test_modernbert_tokenizer import modernbert_folder

import zoo
from zoo.cli import main
from zoo.interop import FastTokenizer

pytestmark = pytest.mark.hf

FAST = ["--batch-size", "4", "--eval-limit", "1", "--no-progress", "--json", "--steps", "2"]
REVIEWS = ["a gorgeous, witty film", "unwatchable and overlong", "the lazy dog", "quick fox"]


def snapshot(folder):
    tokenizer = FastTokenizer.from_folder(modernbert_folder(folder))
    assert tokenizer.bos_id == tokenizer.tokenizer.token_to_id("[CLS]")  # no bos: [CLS] opens
    config = transformers.ModernBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        local_attention=4,
        classifier_pooling="mean",
        num_labels=2,
        pad_token_id=tokenizer.pad_id,
        cls_token_id=tokenizer.bos_id,  # as the hub's config: bos = cls, eos = sep
        bos_token_id=tokenizer.bos_id,
        sep_token_id=tokenizer.eos_id,
        eos_token_id=tokenizer.eos_id,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.ModernBertForSequenceClassification(config), std=0.1)
    model.save_pretrained(folder)
    return folder, model


def test_classify_and_finetune_a_modernbert_folder(tmp_path, capsys):
    folder, hf = snapshot(tmp_path / "snapshot")
    assert main(["classify", str(folder), *REVIEWS[:2], "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    tokenizer = FastTokenizer.from_folder(folder)
    assert tokenizer.bos_id == hf.config.cls_token_id  # classify encodes as training: [CLS] first
    for row, text in zip(rows, REVIEWS[:2], strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([tokenizer.encode(text, add_bos=True)])).logits[0]
        expected = torch.softmax(logits, -1).numpy()
        np.testing.assert_allclose(row["probabilities"], expected, atol=1e-5)

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "validation"):
        lines = [json.dumps({"text": t, "label": i % 2}) for i, t in enumerate(REVIEWS * 4)]
        (data / f"{split}.jsonl").write_text("\n".join(lines))
    out = tmp_path / "run"
    argv = ["train", "classifier", "--init", str(folder), "--data", f"json:{data}"]
    assert main([*argv, "--out", str(out), *FAST]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and np.isfinite(summary["eval_loss"])
    tuned = zoo.load(out)
    assert tuned.config.head.pooler.norm and global_layers(tuned.config) == (0,)
