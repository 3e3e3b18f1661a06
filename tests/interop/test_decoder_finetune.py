"""Fine-tuning a Llama-style checkpoint from the CLI: `zoo train gpt --init DIR` on a folder laid
out like a hub snapshot (config, safetensors, tokenizer.json), in bf16, with a resume."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from fast_tokenizer_folders import llama3_folder
from hf_helpers import randomize, torch, transformers

import zoo
from zoo.cli import main
from zoo.data.tokenizers.base import load_tokenizer
from zoo.interop import FastTokenizer

pytestmark = pytest.mark.hf

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40
FAST = ["--batch-size", "4", "--max-len", "32", "--eval-limit", "1", "--no-progress", "--json"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = llama3_folder(tmp_path_factory.mktemp("llama"))
    vocab = FastTokenizer.from_folder(folder).vocab_size
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    randomize(transformers.LlamaForCausalLM(config), std=0.1).save_pretrained(folder)
    return folder


def test_finetune_a_llama_folder_in_bf16_and_resume(tmp_path, capsys, llama_folder):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "gpt", "--init", str(llama_folder), "--data", f"text:{data}",
            "--precision", "bf16", "--out", str(out), *FAST]  # fmt: skip
    assert main([*argv, "--steps", "2"]) == 0, capsys.readouterr().err
    first = json.loads(capsys.readouterr().out)
    assert main([*argv, "--steps", "4", "--resume"]) == 0, capsys.readouterr().err
    second = json.loads(capsys.readouterr().out)
    assert (first["steps"], second["resumed_from"], second["steps"]) == (2, 2, 4)
    assert np.isfinite(second["eval_loss"])
    model = zoo.load(out)
    rotary = model.config.embedder.positions == "none"
    rotary = rotary and model.config.layers.block.attention.rope is not None
    assert (rotary, model.config.kv_heads) == (True, 2)
    tokenizer = load_tokenizer(out)
    assert isinstance(tokenizer, FastTokenizer)
    assert tokenizer.vocab_size == model.config.vocab_size


def test_from_pretrained_returns_the_folder_tokenizer(llama_folder):
    model, tokenizer = zoo.from_pretrained(llama_folder, return_tokenizer=True)
    assert isinstance(tokenizer, FastTokenizer)
    assert model.config.vocab_size == tokenizer.vocab_size
    ids = tokenizer.encode("Before we proceed", add_bos=True)
    assert ids[0] == tokenizer.bos_id and model(jnp.asarray(ids)).shape == (
        len(ids),
        tokenizer.vocab_size,
    )
