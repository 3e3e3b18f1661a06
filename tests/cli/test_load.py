"""One spelling for a model on the command line: a path, or `hf:NAME` for a hub model.

Every MODEL argument and `zoo train --init` go through `zoo.cli._load`. The hub is replaced by
a stand-in (`from_pretrained` returns a tiny saved model), so nothing is downloaded.
"""

from __future__ import annotations

import json
import string

import jax
import numpy as np
import pytest

import zoo
from zoo.cli import main
from zoo.cli._load import load_model, read_model
from zoo.data import CharTokenizer
from zoo.models.gpt import GPT

TOKENIZER = CharTokenizer(string.ascii_lowercase + "+=0123456789 ")


@pytest.fixture(scope="module")
def hub_model():
    return zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size)


@pytest.fixture
def hub(monkeypatch, hub_model):
    """`from_pretrained` as a hub holding one model; records the names asked for."""
    asked = []

    def from_pretrained(name, *, return_tokenizer=False, **options):
        asked.append(str(name))
        return (hub_model, TOKENIZER) if return_tokenizer else hub_model

    monkeypatch.setattr("zoo.interop.loading.from_pretrained", from_pretrained)
    return asked


def test_hf_names_a_hub_model_for_every_command(hub, hub_model, capsys):
    model, tokenizer = load_model("hf:org/tiny-gpt", GPT)
    assert (model, tokenizer, hub) == (hub_model, TOKENIZER, ["org/tiny-gpt"])
    assert main(["generate", "hf:org/tiny-gpt", "--prompt", "1+2=", "--max-new-tokens", "3",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["prompt"] == "1+2="
    assert main(["classify", "hf:org/tiny-gpt", "abc"]) == 2
    assert "holds a gpt model; this command needs a classifier" in capsys.readouterr().err
    assert hub == ["org/tiny-gpt"] * 3


def test_a_bare_hub_name_is_refused_as_a_model_with_the_spelling_to_use(
    hub, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # no folder named gpt2 here
    assert main(["generate", "gpt2", "--prompt", "abc"]) == 2
    err = capsys.readouterr().err
    assert "MODEL gpt2 is not a model directory (no such folder; a model on the hub is " in err
    assert "written hf:gpt2)" in err
    assert hub == []  # nothing was downloaded


def test_a_bare_hub_name_for_init_still_loads_with_a_note(hub, hub_model, tmp_path, monkeypatch,
                                                          capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    model, tokenizer = read_model("gpt2", option="--init")
    assert (model, tokenizer, hub) == (hub_model, TOKENIZER, ["gpt2"])
    assert (
        "zoo train: --init gpt2 is read as the hub model hf:gpt2; write --init hf:gpt2 (a bare "
        "hub name will stop working)" in capsys.readouterr().err
    )
    # a path that does not exist is never taken for a hub name
    with pytest.raises(FileNotFoundError, match=r"--init \./runs/x is not a model directory \(no"):
        read_model("./runs/x", option="--init")
    assert hub == ["gpt2"]


def test_train_init_takes_a_hub_model(hub, hub_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "gpt", "--init", "hf:org/tiny-gpt", "--data", "synthetic:addition",
                 "--steps", "1", "--batch-size", "4", "--out", str(out), "--no-progress",
                 "--json"]) == 0  # fmt: skip
    assert hub == ["org/tiny-gpt"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 1
    trained = zoo.load(out)
    assert trained.config == hub_model.config
    assert not np.array_equal(trained.embedder.token_weight, hub_model.embedder.token_weight)
