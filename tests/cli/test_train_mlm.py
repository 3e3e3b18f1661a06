"""`zoo train classifier --objective mlm --data text:...` pretrains an encoder that
`zoo train classifier --init RUN` then fine-tunes with a fresh classification head."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import zoo
from tests.cli.conftest import reviews
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer

FAST = ["--steps", "2", "--batch-size", "8", "--max-len", "16", "--eval-limit", "1",
        "--no-progress", "--json"]  # fmt: skip


@pytest.mark.slow
def test_pretrain_with_mlm_then_finetune(tmp_path, capsys, review_dir):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(row["text"] for row in reviews(64, seed=5)) + "\n")
    pretrained = tmp_path / "mlm"
    argv = ["train", "classifier", "--preset", "classifier-tiny", "--objective", "mlm"]
    argv += ["--set", "head.pooler={}"]  # BERT's shape: a pooler, which masked LM never trains
    assert main([*argv, "--data", f"text:{text}", "--out", str(pretrained), *FAST]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and summary["metric_name"] == "accuracy"
    encoder = zoo.load(pretrained)
    tokenizer = load_tokenizer(pretrained)
    # the word tokenizer has no mask token: the model holds one more id for it
    assert encoder.mlm_head is not None and encoder.config.mask_id == tokenizer.vocab_size
    assert encoder.config.vocab_size == tokenizer.vocab_size + 1

    tuned = tmp_path / "tuned"
    argv = ["train", "classifier", "--init", str(pretrained), "--data", f"json:{review_dir}"]
    assert main([*argv, "--out", str(tuned), *FAST, "--freeze", "embeddings,layers:0-1"]) == 0
    err = capsys.readouterr().err
    assert "pretrained with a masked-LM head" in err and "initialised fresh" in err
    model = zoo.load(tuned)
    assert model.mlm_head is None and not model.config.masked_lm
    # with the encoder frozen it is exactly the pretrained one: its weights were carried over
    for ours, theirs in zip(jax.tree.leaves(model.encoder), jax.tree.leaves(encoder.encoder)):
        assert np.array_equal(ours, theirs)

    # LoRA: the pooler is as new as the head, so both train whole (PEFT's modules_to_save);
    # otherwise the adapters would learn on top of a random dense layer
    adapted = tmp_path / "lora"
    lora = ["--lora", "rank=2,alpha=4,targets=attention"]
    assert main([*argv, "--out", str(adapted), *FAST, *lora]) == 0
    config = json.loads((adapted / "adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["bert.pooler.dense", "classifier"]
    assert not np.array_equal(zoo.load(adapted).pooler.weight, model.pooler.weight)


def test_mlm_is_for_classifiers_and_needs_a_masked_lm_head(tmp_path, capsys, review_dir):
    argv = ["train", "gpt", "--preset", "gpt-tiny", "--objective", "mlm", "--out", str(tmp_path)]
    assert main([*argv, "--data", "text:x.txt"]) != 0
    assert "use `zoo train classifier`" in capsys.readouterr().err
