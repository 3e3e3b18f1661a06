"""`zoo export MODEL --hf DIR`: a run trained with `--init` from a HuggingFace folder, exported,
gives transformers zoo's logits and chat template ids; a LoRA model is exported merged; what
transformers cannot read (char and word tokenizers, a model no HF architecture expresses) and
an output folder in use are refused before anything is written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main
from zoo.data.tokenizers import build_tokenizer
from zoo.presets import count_params

TEXTS = ["the film was good", "a dull and poor plot", "great fun"]
MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]
CHATS = [
    [{"role": "user", "content": "Hello, how are you?"},
     {"role": "assistant", "content": "I'm doing great, thank you!"}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}],
]  # fmt: skip
IDS = jnp.array([3, 17, 5, 42, 8, 9, 11], dtype=jnp.int32)


def export(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["export", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def saved(folder: Path, preset: str, tokenizer) -> Path:
    model = zoo.create(preset, key=jax.random.key(0), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id)  # fmt: skip
    return zoo.save(model, folder, tokenizer=tokenizer)


def fast_tokenizer(folder: Path):
    """The tiny Qwen2.5-Instruct tokenizer (tokenizer.json and its ChatML template)."""
    if importlib.util.find_spec("tokenizers") is None:
        pytest.skip("needs the tokenizers library (zoo[hf])")
    from tests.data.chat_folders import qwen25_folder
    from zoo.interop import pretrained_tokenizer

    return pretrained_tokenizer(qwen25_folder(folder))


def llama(tokenizer):
    return zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=tokenizer.vocab_size,
                      pad_id=tokenizer.pad_id, bos_id=None, eos_id=tokenizer.eos_id)  # fmt: skip


# -- refusals: nothing is written ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["word", "char"])
def test_a_char_or_word_tokenizer_is_refused(kind, tmp_path, capsys):
    run = saved(tmp_path / "run", "gpt-tiny", build_tokenizer(kind, TEXTS))
    status, out, err = export(capsys, str(run), "--hf", str(tmp_path / "hf"))
    assert (status, out) == (2, "")
    assert err == (
        f"zoo export: error: {run} has a {kind} tokenizer, which transformers cannot load; train "
        "with a tokenizer.json (zoo train --init hf:NAME or a checkpoint folder that has one), or "
        "pass --no-tokenizer to export the weights and config.json alone\n"
    )
    assert not (tmp_path / "hf").exists()


def test_a_tiktoken_tokenizer_is_refused_and_the_weights_export_alone(tmp_path, capsys):
    try:
        tokenizer = build_tokenizer("tiktoken:gpt2")
    except OSError as error:
        pytest.skip(f"tiktoken gpt2 encoding not available offline: {error}")
    run = saved(tmp_path / "run", "gpt-tiny", tokenizer)
    status, _, err = export(capsys, str(run), "--hf", str(tmp_path / "hf"))
    assert status == 2
    assert err == (
        f"zoo export: error: {run} has a tiktoken tokenizer (gpt2), which transformers cannot "
        "load from zoo's files; pass --no-tokenizer to export the weights and config.json alone "
        "(transformers' GPT-2 tokenizer gives the same ids), or train with a tokenizer.json (zoo "
        "train --init hf:NAME or a checkpoint folder that has one)\n"
    )
    status, _, _ = export(capsys, str(run), "--hf", str(tmp_path / "hf"), "--no-tokenizer")
    assert status == 0
    assert sorted(path.name for path in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]


def test_a_model_without_an_hf_architecture_is_refused_in_one_line(tmp_path, capsys):
    run = saved(tmp_path / "run", "classifier-tiny", build_tokenizer("word", TEXTS))
    status, _, err = export(capsys, str(run), "--hf", str(tmp_path / "hf"), "--no-tokenizer")
    assert status == 2
    assert err == (
        f"zoo export: error: {run} cannot be exported to transformers: "
        "BertForSequenceClassification cannot express this zoo model: "
        "layers.block.norm_first=True (needs False), embedder.norm=None (needs "
        "NormSettings(kind='layernorm', eps=1e-05, weight_offset=0.0, bias=True)), "
        "head.pooling='mean' (needs 'first'), head.pooler=None (needs Pooler(activation='tanh', "
        "bias=True, norm=False)); train with a preset of a HuggingFace family (gpt2, llama-tiny, "
        "bert-base, ...: see zoo presets) or keep using the model with zoo\n"
    )
    assert not (tmp_path / "hf").exists()


def test_an_output_folder_in_use_is_refused_unless_forced(tmp_path, capsys):
    run = saved(tmp_path / "run", "gpt-tiny", build_tokenizer("word", TEXTS))
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    status, _, err = export(capsys, str(run), "--hf", str(out), "--no-tokenizer")
    assert status == 2
    assert err == (
        f"zoo export: error: --hf {out} exists and is not empty; name a new or empty folder, or "
        "pass --force to write into it (files of the same names are replaced)\n"
    )
    assert [path.name for path in out.iterdir()] == ["notes.txt"]
    status, _, err = export(capsys, str(run), "--hf", str(run), "--no-tokenizer", "--force")
    assert status == 2
    assert err == (
        f"zoo export: error: --hf {run} is the folder of MODEL {run}: the export would overwrite "
        "its config.json; name another folder\n"
    )
    status, _, err = export(capsys, str(run), "--hf", str(out / "notes.txt"), "--no-tokenizer")
    assert status == 2
    assert err == (
        f"zoo export: error: --hf {out / 'notes.txt'} is a file; name a new or empty folder to "
        "export into\n"
    )
    assert export(capsys, str(run), "--hf", str(out), "--no-tokenizer", "--force")[0] == 0
    assert sorted(path.name for path in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "notes.txt",
    ]


# -- what is written -----------------------------------------------------------------------------


def test_json_names_the_architecture_the_parameters_and_the_files(tmp_path, capsys):
    tokenizer = fast_tokenizer(tmp_path / "tokenizer")
    model = llama(tokenizer)
    run = zoo.save(model, tmp_path / "run", tokenizer=tokenizer)
    status, out, _ = export(capsys, str(run), "--hf", str(tmp_path / "hf"), "--json")
    assert status == 0
    assert json.loads(out) == {
        "hf": str(tmp_path / "hf"),
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "parameters": count_params(model),
        "tokenizer": "tokenizer.json",
        "chat_template": True,
        "merged_lora": False,
        "files": [
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "zoo_tokenizer.json",
        ],
    }
    status, out, _ = export(capsys, str(run), "--hf", str(tmp_path / "hf2"))
    assert out == (
        f"zoo export: wrote LlamaForCausalLM ({count_params(model):,} parameters) to "
        f"{tmp_path / 'hf2'}\n"
    )


def with_trained_adapters(model):
    """`model` with LoRA adapters whose B is not zero (so merging changes the weights)."""
    adapted = zoo.lora.apply(model, rank=2, alpha=4, targets="all-linear", key=jax.random.key(1))

    def bump(path, leaf):
        on_b = any(getattr(entry, "name", None) == "lora_b" for entry in path)
        return leaf + 0.05 if on_b else leaf

    return jax.tree_util.tree_map_with_path(bump, adapted)


def test_a_lora_run_and_an_adapter_folder_are_exported_merged(tmp_path, capsys):
    tokenizer = fast_tokenizer(tmp_path / "tokenizer")
    base = llama(tokenizer)
    adapted = with_trained_adapters(base)
    expected = adapted(IDS)
    assert not np.allclose(expected, base(IDS), atol=1e-3)  # the adapters matter
    run = zoo.save(adapted, tmp_path / "lora", tokenizer=tokenizer)
    status, out, _ = export(capsys, str(run), "--hf", str(tmp_path / "hf"), "--json")
    assert status == 0
    record = json.loads(out)
    assert record["merged_lora"] is True
    assert record["parameters"] == count_params(base)  # the adapters folded in, not added
    exported = zoo.from_pretrained(tmp_path / "hf")
    np.testing.assert_allclose(exported(IDS), expected, atol=1e-5)
    # the same adapters as a PEFT folder on the base model: --adapter
    zoo.lora.save_adapter(adapted, tmp_path / "adapter")
    base_run = zoo.save(base, tmp_path / "base", tokenizer=tokenizer)
    status, out, _ = export(capsys, str(base_run), "--adapter", str(tmp_path / "adapter"),
                            "--hf", str(tmp_path / "hf-peft"))  # fmt: skip
    assert status == 0
    assert out.startswith("zoo export: wrote LlamaForCausalLM (") and "LoRA merged" in out
    from_peft = zoo.from_pretrained(tmp_path / "hf-peft")
    np.testing.assert_allclose(from_peft(IDS), expected, atol=1e-5)


@pytest.mark.hf
@pytest.mark.slow
def test_an_init_run_exported_gives_transformers_zoos_logits_and_chat_ids(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="needs torch (zoo[hf])")
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")
    from zoo.data.chat.tokens import encode_prompt, end_of_turn_ids
    from zoo.interop import save_hf
    from zoo.serialize import load_with_tokenizer

    tokenizer = fast_tokenizer(tmp_path / "tokenizer")
    start = save_hf(llama(tokenizer), tmp_path / "start", tokenizer=tokenizer)
    write_jsonl(tmp_path / "chats", "train", [{"messages": chat} for chat in CHATS * 4])
    run = tmp_path / "run"
    train = ["train", "gpt", "--init", str(start), "--data", f"json:{tmp_path / 'chats'}",
             "--steps", "3", "--batch-size", "2", "--max-len", "127", "--lr", "1e-2",
             "--out", str(run), "--no-progress", "--json"]  # fmt: skip
    assert main(train) == 0
    capsys.readouterr()
    assert export(capsys, str(run), "--hf", str(tmp_path / "hf"))[0] == 0

    model, run_tokenizer = load_with_tokenizer(run)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32
    )
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        theirs = hf_model(torch.tensor(np.asarray(IDS))[None]).logits[0].numpy()
    ours = np.asarray(model(IDS))
    assert not np.allclose(ours, np.asarray(llama(tokenizer)(IDS)), atol=1e-3)  # it trained
    np.testing.assert_allclose(theirs, ours, atol=1e-5)

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for messages in (MESSAGES, CHATS[1][:1]):
        rendered = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True
        )
        assert list(rendered["input_ids"]) == encode_prompt(messages, run_tokenizer).tolist()
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) >= set(end_of_turn_ids(run_tokenizer))


@pytest.mark.hf
@pytest.mark.slow
def test_a_run_trained_with_a_template_file_exports_that_template(tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")
    pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")
    from zoo.data.chat.tokens import encode_prompt
    from zoo.interop import save_hf
    from zoo.serialize import load_with_tokenizer

    tokenizer = fast_tokenizer(tmp_path / "tokenizer")
    start = save_hf(llama(tokenizer), tmp_path / "start", tokenizer=tokenizer)
    # ChatML with a fixed system line of its own, so that it differs from the tokenizer's
    own = tokenizer.chat_template
    template = own.replace("You are a helpful assistant.", "Answer in one line.")
    assert template != own
    (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
    write_jsonl(tmp_path / "chats", "train", [{"messages": chat} for chat in CHATS * 4])
    run = tmp_path / "run"
    train = ["train", "gpt", "--init", str(start), "--data", f"json:{tmp_path / 'chats'}",
             "--steps", "1", "--batch-size", "2", "--max-len", "127", "--template",
             str(tmp_path / "t.jinja"), "--out", str(run), "--no-progress", "--json"]  # fmt: skip
    assert main(train) == 0
    capsys.readouterr()
    assert (run / "chat_template.jinja").read_text(encoding="utf-8") == template
    assert export(capsys, str(run), "--hf", str(tmp_path / "hf"))[0] == 0
    assert (tmp_path / "hf" / "chat_template.jinja").read_text(encoding="utf-8") == template
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    rendered = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                return_dict=True)  # fmt: skip
    _, run_tokenizer = load_with_tokenizer(run)
    assert list(rendered["input_ids"]) == encode_prompt(MESSAGES, run_tokenizer).tolist()
    assert "Answer in one line." in hf_tokenizer.decode(rendered["input_ids"])
