"""`zoo train --lora`: adapters only, resume, `--merge`, the PEFT adapter/ folder, and
`zoo generate BASE --adapter DIR`."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import zoo
from tests.lora.helpers import forward
from zoo.cli import main
from zoo.cli._lora import LoRASpec, parse_lora

COMMON = ["--data", "synthetic:addition", "--batch-size", "8", "--lr", "1e-2", "--log-every", "1",
          "--eval-limit", "1", "--no-progress", "--json"]  # fmt: skip
TOKENS = np.array([[1, 5, 9, 4, 7, 3]])


def test_parse_lora():
    assert parse_lora("rank=4,alpha=8,targets=query_proj,value_proj,train=head") == LoRASpec(
        4, 8.0, ("query_proj", "value_proj"), ("head",)
    )
    assert parse_lora("rank=16") == LoRASpec(16, 32.0, ("attention",), None)
    with pytest.raises(
        ValueError, match="unknown key 'rnak'; keys are rank, alpha, dropout, targets"
    ):
        parse_lora("rnak=4")
    with pytest.raises(ValueError, match="rank is an integer"):
        parse_lora("rank=four")


@pytest.mark.slow
def test_lora_run_resume_merge_and_generate_with_an_adapter(tmp_path, capsys):
    base, run = tmp_path / "base", tmp_path / "lora"
    assert main(["train", "gpt", "--preset", "gpt-tiny", *COMMON, "--steps", "2",
                 "--out", str(base)]) == 0  # fmt: skip
    capsys.readouterr()
    lora = ["train", "gpt", "--init", str(base), *COMMON, "--out", str(run),
            "--lora", "rank=4,alpha=8,targets=attention", "--checkpoint-every", "2"]  # fmt: skip
    assert main([*lora, "--steps", "2"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["adapter"] == str(run / "adapter")
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    # GPT-2's fused c_attn takes q, k and v at rank 3 * 4; c_proj keeps rank 4 (same scale 2)
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (12, 24.0, "CAUSAL_LM")
    assert config["rank_pattern"]["transformer\\.h\\.1\\.attn\\.c_proj"] == 4
    assert config["base_model_name_or_path"] == str(base)
    # the run directory's model carries its adapters; the base weights did not move
    base_model, adapted = zoo.load(base), zoo.load(run)
    query = zoo.lora.lora_layers(adapted)["layers.blocks.self_attention.query_proj"]
    np.testing.assert_array_equal(
        query.base.weight, base_model.layers.blocks.self_attention.query_proj.weight
    )
    np.testing.assert_array_equal(adapted.embedder.token_weight, base_model.embedder.token_weight)
    assert np.abs(np.asarray(query.lora_b)).max() > 0

    assert main([*lora, "--steps", "4", "--resume", "--merge"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["steps"], second["resumed_from"]) == (4, 2)
    merged = zoo.load(run)
    assert not zoo.lora.has_lora(merged)
    with_adapter = zoo.lora.load_adapter(base_model, run / "adapter")
    np.testing.assert_allclose(forward(merged, TOKENS), forward(with_adapter, TOKENS), atol=1e-5)

    prompt = ["generate", "--prompt", "12+3=", "--max-new-tokens", "4", "--json"]
    assert main([prompt[0], str(run), *prompt[1:]]) == 0
    from_merged = json.loads(capsys.readouterr().out)
    assert main([prompt[0], str(base), "--adapter", str(run / "adapter"), *prompt[1:]]) == 0
    assert json.loads(capsys.readouterr().out) == from_merged


def test_lora_options_are_checked(tmp_path, capsys):
    args = ["train", "gpt", "--preset", "gpt-tiny", *COMMON, "--steps", "1", "--out", str(tmp_path)]
    assert main([*args, "--merge"]) == 2
    assert (
        "--merge folds LoRA adapters into the weights: use it with --lora"
        in capsys.readouterr().err
    )
    assert main([*args, "--quantize", "int8"]) == 2
    assert (
        "--quantize stores the frozen base of LoRA adapters: use it with --lora"
        in capsys.readouterr().err
    )
    assert main([*args, "--lora", "targets=attn"]) == 2
    assert "'attn' matches no Linear layer" in capsys.readouterr().err


@pytest.mark.slow
def test_classifier_lora_run_trains_adapters_and_head(tmp_path, capsys):
    base, run = tmp_path / "base", tmp_path / "lora"
    majority = [*COMMON[2:], "--data", "synthetic:majority"]  # COMMON opens with --data
    common = [*majority, "--steps", "2"]
    assert main(["train", "classifier", "--preset", "classifier-tiny", *common,
                 "--out", str(base)]) == 0  # fmt: skip
    assert main(["train", "classifier", "--init", str(base), *common, "--out", str(run),
                 "--lora", "rank=2,alpha=4,targets=attention.qv", "--merge"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["steps"], summary["adapter"]) == (2, str(run / "adapter"))
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (2, 4.0, "SEQ_CLS")
    assert config["modules_to_save"] == ["classifier"]  # a classifier's head trains whole
    assert config["target_modules"] == ["query", "value"]  # as PEFT writes them
    base_model, merged = zoo.load(base), zoo.load(run)
    assert not zoo.lora.has_lora(merged)
    # the head moved, the layers without adapters did not
    assert not np.array_equal(merged.head.weight, base_model.head.weight)
    np.testing.assert_array_equal(
        merged.encoder.blocks.self_attention.key_proj.weight,
        base_model.encoder.blocks.self_attention.key_proj.weight,
    )
    with_adapter = zoo.lora.load_adapter(base_model, run / "adapter")
    np.testing.assert_allclose(forward(merged, TOKENS), forward(with_adapter, TOKENS), atol=1e-5)


@pytest.mark.slow
def test_lora_on_an_int8_base_trains_saves_resumes_and_merges(tmp_path, capsys):
    run = tmp_path / "qlora"
    args = ["train", "gpt", "--preset", "gpt-tiny", *COMMON, "--out", str(run), "--lora",
            "rank=4,targets=attention", "--quantize", "int8", "--checkpoint-every", "2"]  # fmt: skip
    assert main([*args, "--steps", "2"]) == 0
    adapted = zoo.load(run)
    paths = zoo.lora.quantized_paths(adapted)
    assert paths == [
        "layers.blocks.self_attention.query_proj.base",
        "layers.blocks.self_attention.key_proj.base",
        "layers.blocks.self_attention.value_proj.base",
        "layers.blocks.self_attention.output_proj.base",
        "layers.blocks.feed_forward.hidden",
        "layers.blocks.feed_forward.output",
    ]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    capsys.readouterr()
    assert main([*args, "--steps", "3", "--resume", "--merge"]) == 0
    assert json.loads(capsys.readouterr().out)["resumed_from"] == 2
    merged = zoo.load(run)  # adapters folded into the dequantized weights: a float model
    assert zoo.lora.quantized_paths(merged) == []
    assert merged.layers.blocks.feed_forward.hidden.weight.dtype == np.float32


@pytest.mark.slow
def test_qlora_with_dropout_from_the_command_line(tmp_path, capsys):
    """`--lora ...,dropout=0.1 --quantize nf4`: an NF4 base, adapters that drop, both recorded."""
    run = tmp_path / "qlora"
    assert main(["train", "gpt", "--preset", "gpt-tiny", *COMMON, "--out", str(run), "--lora",
                 "rank=4,dropout=0.1,targets=attention", "--quantize", "nf4",
                 "--steps", "2"]) == 0  # fmt: skip
    capsys.readouterr()
    adapted = zoo.load(run)
    layers = zoo.lora.lora_layers(adapted)
    assert {layer.dropout for layer in layers.values()} == {0.1}
    assert all(isinstance(layer.base, zoo.lora.NF4Linear) for layer in layers.values())
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert config["lora_dropout"] == 0.1


def test_lora_on_an_init_folder_names_its_tokenizer_base_and_targets(tmp_path, monkeypatch,
                                                                     capsys):  # fmt: skip
    """The defaults banner names the --init model's tokenizer (not the preset's char
    default); the adapter names its base by absolute path and its targets as PEFT does."""
    from tests.cli.conftest import write_jsonl
    from tests.data.chat_folders import qwen25_folder
    from zoo.interop import pretrained_tokenizer

    tokenizer = pretrained_tokenizer(qwen25_folder(tmp_path / "tokenizer"))
    model = zoo.create("gpt-tiny", key=jax.random.key(0), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id, bos_id=None, eos_id=tokenizer.eos_id)  # fmt: skip
    zoo.save(model, tmp_path / "base", tokenizer=tokenizer)
    write_jsonl(tmp_path / "text", "train", [{"text": "hello there, how are you?"}] * 8)
    monkeypatch.chdir(tmp_path)  # --init as a relative path
    assert main(["train", "gpt", "--init", "base", "--data", "json:text", "--steps", "1",
                 "--batch-size", "2", "--max-len", "16", "--out", "run", "--no-progress",
                 "--lora", "rank=2,targets=attention"]) == 0  # fmt: skip
    banner = [line for line in capsys.readouterr().err.splitlines() if "defaults:" in line]
    assert len(banner) == 1 and "tokenizer=the --init model's (tokenizer.json)" in banner[0]
    assert "tokenizer=char" not in banner[0]
    config = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path.resolve() / "base")
    assert config["target_modules"] == ["attn.c_proj", "c_attn"]  # GPT-2's mlp.c_proj: none


def test_an_adapters_base_is_named_as_peft_finds_it(tmp_path):
    from zoo.cli._lora import base_model_name

    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert base_model_name(str(snapshot), None) == "HuggingFaceTB/SmolLM2-135M"
    assert base_model_name("hf:gpt2", None) == "gpt2"
    assert base_model_name(None, "gpt-tiny") == "gpt-tiny"
    assert base_model_name(str(tmp_path / "hub" / ".." / "hub"), None) == str(tmp_path / "hub")
