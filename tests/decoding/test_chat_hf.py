"""zoo chat against transformers: a tiny Qwen2.5-shaped model instruction-tuned here, exported
with its tokenizer and chat template (`save_hf(..., tokenizer=...)`), answers through
`apply_chat_template` + greedy `generate` with the tokens `zoo.chat` gives, stopping at the
same end of turn; the run that `zoo train --init` makes from the export does too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import jax
import numpy as np
import pytest

import zoo
from tests.data.chat_folders import qwen25_folder
from zoo.cli import main
from zoo.data.chat.datasets import chat_data
from zoo.data.chat.options import ChatDataConfig
from zoo.data.chat.tokens import end_of_turn_ids
from zoo.decoding.chat import reply
from zoo.interop import pretrained_tokenizer, save_hf
from zoo.interop.tokenizers.hf_tokenizer import HFTokenizer
from zoo.serialize import load_with_tokenizer

pytestmark = pytest.mark.hf
pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")
torch = pytest.importorskip("torch", reason="needs torch (zoo[hf])")
transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CHATS = [
    [{"role": "user", "content": "Hello, how are you?"},
     {"role": "assistant", "content": "I'm doing great, thank you!"}],
    [SYSTEM, {"role": "user", "content": "Tell me a joke about cats."},
     {"role": "assistant", "content": "Why did the cat sit on the computer?"}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}],
]  # fmt: skip
QUESTIONS = [chat[:-1] for chat in CHATS]


def hf_tokenizer(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def hf_reply(folder: Path, messages: list[dict], max_new_tokens: int) -> list[int]:
    """transformers' greedy answer: the new ids, the end-of-turn token included."""
    tokenizer = hf_tokenizer(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def assert_same_answers(model, tokenizer, folder: Path) -> None:
    ends = set(end_of_turn_ids(tokenizer))
    for messages in QUESTIONS:
        ours = reply(model, tokenizer, messages, max_new_tokens=32)
        theirs = hf_reply(folder, messages, max_new_tokens=32)
        if ours.finish_reason == "stop":  # transformers keeps the end token, zoo leaves it out
            assert theirs[-1] in ends
            theirs = theirs[:-1]
        assert list(ours.tokens) == theirs


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """llama-tiny on the Qwen2.5 folder's tokenizer, trained until it answers the chats."""
    root = tmp_path_factory.mktemp("qwen-chat")
    tokenizer = pretrained_tokenizer(qwen25_folder(root / "tokenizer"))
    data = chat_data(datasets.Dataset.from_dict({"messages": CHATS * 4}), tokenizer=tokenizer,
                     config=ChatDataConfig(max_len=127, batch_size=2, seed=0))  # fmt: skip
    model = zoo.create(
        "llama-tiny", key=jax.random.key(0), vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id, bos_id=None, eos_id=tokenizer.eos_id,
    )  # fmt: skip
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), zoo.train.adamw(1e-2, warmup=5),
                          loop=zoo.train.LoopSettings(progress=False))  # fmt: skip
    model, _ = trainer.fit(model, data.train, steps=80, key=jax.random.key(1))
    return model, tokenizer, root


@pytest.mark.slow
def test_the_export_answers_in_transformers_as_zoo_chat(tuned):
    model, tokenizer, root = tuned
    answers = [reply(model, tokenizer, messages, max_new_tokens=32) for messages in QUESTIONS]
    assert [answer.finish_reason for answer in answers] == ["stop"] * 3  # it learnt the ends
    assert answers[0].text == "I'm doing great, thank you!"
    folder = save_hf(model, root / "export", tokenizer=tokenizer)
    assert (folder / "chat_template.jinja").is_file()
    generation = json.loads((folder / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) == set(end_of_turn_ids(tokenizer))
    assert_same_answers(model, tokenizer, folder)


@pytest.mark.slow
def test_zoo_train_init_from_the_export_keeps_the_template_and_the_answers(tuned, tmp_path, capsys):
    model, tokenizer, _ = tuned
    export = save_hf(model, tmp_path / "export", tokenizer=tokenizer)
    chats = tmp_path / "chats"
    chats.mkdir()
    lines = [json.dumps({"messages": chat}) for chat in CHATS * 4]
    (chats / "train.jsonl").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    args = ["train", "gpt", "--init", str(export), "--data", f"json:{chats}", "--steps", "2",
            "--batch-size", "2", "--max-len", "127", "--lr", "1e-4", "--out", str(run),
            "--no-progress", "--json"]  # fmt: skip
    assert main(args) == 0
    assert f"the chat template of the {tokenizer.kind} tokenizer" in capsys.readouterr().err
    tuned_again, saved_tokenizer = load_with_tokenizer(run)
    assert saved_tokenizer.chat_template == tokenizer.chat_template
    assert main(["chat", str(run), "--message", QUESTIONS[0][0]["content"], "--json",
                 "--max-new-tokens", "32"]) == 0  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    again = save_hf(tuned_again, tmp_path / "export-again", tokenizer=saved_tokenizer)
    theirs = hf_reply(again, QUESTIONS[0], max_new_tokens=32)
    assert record["reply"] == hf_tokenizer(again).decode(theirs, skip_special_tokens=True)
    assert_same_answers(tuned_again, saved_tokenizer, again)


def test_a_template_that_ends_turns_with_another_token_than_eos_stops_there(tmp_path):
    # A base model's files: eos <|endoftext|>, while its chat template closes turns with
    # <|im_end|> (as Qwen2.5-0.5B without -Instruct ships them).
    folder = qwen25_folder(tmp_path / "qwen")
    base = tmp_path / "base"
    shutil.copytree(folder, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    (base / "tokenizer_config.json").write_text(
        json.dumps({**config, "eos_token": "<|endoftext|>"})
    )
    (base / "generation_config.json").unlink()
    (base / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    for tokenizer in (pretrained_tokenizer(base), HFTokenizer(hf_tokenizer(base))):
        end, im_end = tokenizer.encode("<|endoftext|><|im_end|>")
        assert tokenizer.eos_ids == (end,)
        assert end_of_turn_ids(tokenizer) == (end, im_end)
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=tokenizer.vocab_size)
    first = reply(model, tokenizer, "Hello", max_new_tokens=5)
    np.testing.assert_array_equal([t in (end, im_end) for t in first.tokens], False)
