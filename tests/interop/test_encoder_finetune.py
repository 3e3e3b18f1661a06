"""Fine-tuning a RoBERTa folder from the CLI: `zoo train classifier --init DIR` on a
folder laid out like a hub snapshot (config, safetensors, tokenizer.json), then export."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from encoder_tokenizer_folders import roberta_folder
from hf_helpers import randomize, torch, transformers

import zoo
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer
from zoo.interop import FastTokenizer, save_hf

pytestmark = pytest.mark.hf

FAST = ["--batch-size", "4", "--eval-limit", "1", "--no-progress", "--json", "--steps", "2"]
REVIEWS = ["a gorgeous, witty film", "unwatchable and overlong", "the lazy dog", "quick fox"] * 4


def snapshot(folder):
    roberta_folder(folder)
    config = transformers.RobertaConfig(
        vocab_size=FastTokenizer.from_folder(folder).vocab_size,
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=48,
        max_position_embeddings=34,
        type_vocab_size=1,
    )
    torch.manual_seed(0)
    model = transformers.RobertaForSequenceClassification(config)
    randomize(model, std=0.1).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_finetune_a_roberta_snapshot_from_the_cli_and_export(tmp_path, capsys):
    folder = snapshot(tmp_path / "snapshot")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "validation"):
        rows = [{"text": t, "label": i % 2} for i, t in enumerate(REVIEWS)]
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "run"
    argv = ["train", "classifier", "--init", str(folder), "--data", f"json:{data}"]
    assert main([*argv, "--out", str(out), *FAST]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and np.isfinite(summary["eval_loss"])
    model = zoo.load(out)
    assert model.config.max_tokens == 32  # 34 positions less RoBERTa's offset of 2
    tokenizer = load_tokenizer(out)
    assert isinstance(tokenizer, FastTokenizer) and tokenizer.vocab_size == model.config.vocab_size
    save_hf(model, tmp_path / "export")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "export")
    ids = tokenizer.encode(REVIEWS[0], add_bos=True)
    with torch.no_grad():
        theirs = reloaded.eval()(torch.tensor([ids])).logits[0].numpy()
    assert np.allclose(np.asarray(model(jnp.array(ids))), theirs, atol=1e-4)
