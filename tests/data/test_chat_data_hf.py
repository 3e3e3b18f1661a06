"""Chat data and chat templates against transformers, on the tiny Qwen2.5 / Llama 3.2 / SmolLM2
folders of chat_folders.py: batch rows and loss masks equal `apply_chat_template` ids and its
assistant mask, and the template survives a FastTokenizer's load and save wherever the snapshot
keeps it (transformers reads the saved folder to the same ids)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest

from zoo.data.chat.datasets import chat_data
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.options import ChatDataConfig
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_prompt
from zoo.data.tokenizers.base import load_tokenizer
from zoo.interop import pretrained_tokenizer

from .chat_folders import FOLDERS, READ_AS_IS, template
from .test_chat_template_hf import CONVERSATIONS, VARIABLES, qwen_with_generation_blocks

pytestmark = pytest.mark.hf
pytest.importorskip("jinja2", reason="chat templates need jinja2 (zoo[chat])")
transformers = pytest.importorskip("transformers", reason="needs transformers (zoo[hf])")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_data_snapshots")
    return {family: build(root / family) for family, build in FOLDERS.items()}


def reference(folder: Path, family: str):
    kind = (
        transformers.PreTrainedTokenizerFast if family in READ_AS_IS else transformers.AutoTokenizer
    )
    return kind.from_pretrained(str(folder))


def test_batch_rows_and_loss_masks_equal_transformers_assistant_masks(folders):
    tokenizer = pretrained_tokenizer(folders["qwen2.5"])
    hf = reference(folders["qwen2.5"], "qwen2.5")
    marked = qwen_with_generation_blocks()
    conversations = list(CONVERSATIONS.values())
    dataset = datasets.Dataset.from_dict({"messages": conversations * 2})
    config = ChatDataConfig(template=marked, pack=False, batch_size=1, max_len=255,
                            validation_split=None, holdout=0.5, seed=0)  # fmt: skip
    data = chat_data(dataset, tokenizer=tokenizer, config=config)
    expected = {}
    for messages in conversations:
        found = hf.apply_chat_template(messages, chat_template=marked, tokenize=True,
                                       return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        expected[tuple(found["input_ids"])] = list(found["assistant_masks"])
    source = data.train
    for step in range(len(source)):
        batch = source.batch(step)
        length = int((batch["tokens"][0] != tokenizer.pad_id).sum())
        ids = tuple(batch["tokens"][0, :length].tolist())
        assert batch["loss_mask"][0, :length].tolist() == expected[ids]
        assert batch["loss_mask"][0, length:].sum() == 0
    assert data.counts["train"]["trained_tokens"] > 0


def copy_without_template(folder: Path, target: Path) -> Path:
    """The snapshot with its template moved from tokenizer_config.json to chat_template.jinja,
    the layout of snapshots saved by transformers 5."""
    shutil.copytree(folder, target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "chat_template.jinja").write_text(config.pop("chat_template"))
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("family", FOLDERS)
def test_a_template_file_survives_load_and_save_and_transformers_reads_it(
    folders, family, tmp_path
):
    snapshot = copy_without_template(folders[family], tmp_path / "snapshot")
    tokenizer = pretrained_tokenizer(snapshot)
    assert tokenizer.chat_template == template(f"{family}-instruct")
    assert chat_template_for(tokenizer).source == tokenizer.chat_template
    tokenizer.save(tmp_path / "saved")
    saved = tmp_path / "saved"
    assert (saved / "chat_template.jinja").read_text() == tokenizer.chat_template
    assert "chat_template" not in json.loads((saved / "tokenizer_config.json").read_text())
    again = load_tokenizer(saved)
    assert again.chat_template == tokenizer.chat_template
    messages, variables = CONVERSATIONS["multi-turn"][:3], VARIABLES.get(family, {})
    ids = encode_prompt(messages, again, **variables).tolist()
    hf = reference(saved, family)
    expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=True, **variables)["input_ids"]  # fmt: skip
    assert ids == list(expected)


def test_named_templates_are_saved_as_transformers_saves_them(folders, tmp_path):
    snapshot = copy_without_template(folders["qwen2.5"], tmp_path / "snapshot")
    (snapshot / "additional_chat_templates").mkdir()
    tool_use = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (snapshot / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    tokenizer = pretrained_tokenizer(snapshot)
    assert set(tokenizer.chat_template) == {"default", "tool_use"}
    tokenizer.save(tmp_path / "saved")
    assert (
        tmp_path / "saved" / "additional_chat_templates" / "tool_use.jinja"
    ).read_text() == tool_use
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert hf.chat_template == tokenizer.chat_template
    picked = chat_template_for(load_tokenizer(tmp_path / "saved"), tools=True)
    assert isinstance(picked, ChatTemplate) and picked.source == tool_use
