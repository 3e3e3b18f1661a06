"""Pickled checkpoints as they sit on the hub: `pytorch_model.bin` (whole or sharded), legacy
key names, bare GPT-2 keys, BERT pretraining heads; read safely, by folder and by hub name."""

from __future__ import annotations

import json
import logging
import pickle
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, batched, jnp_int, max_diff, torch, transformers
from hub_stub import stub_hub
from test_bert_parity import make_hf as make_bert
from test_gpt2_parity import make_hf as make_gpt2
from test_marian_parity import SOURCE, SOURCE_REAL, TARGET, hf_logits
from test_marian_parity import make_hf as make_marian

from zoo.interop import FreshWeightsWarning, from_hf, from_pretrained, load_state_dict

pytestmark = pytest.mark.hf

HUB_NAME = "Helsinki-NLP/opus-mt-de-en"
# what a hub repository holds besides the weights; none of it is downloaded for the model
OTHER_FILES = ("README.md", ".gitattributes", "tf_model.h5", "rust_model.ot")


def write_pickled(folder, hf, state=None, shards: int = 1):
    """config.json and `torch.save(state_dict)` as transformers 4 wrote them: whole or sharded."""
    folder.mkdir(parents=True, exist_ok=True)
    hf.config.architectures = [type(hf).__name__]
    hf.config.save_pretrained(folder)
    (folder / "generation_config.json").write_text("{}")
    for name in OTHER_FILES:
        (folder / name).write_bytes(b"not weights")
    state = hf.state_dict() if state is None else state
    if shards == 1:
        torch.save(state, folder / "pytorch_model.bin")
        return ["config.json", "generation_config.json", "pytorch_model.bin"]
    keys = sorted(state)
    files = [f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin" for i in range(shards)]
    weight_map = {}
    for i, file in enumerate(files):
        part = keys[i::shards]
        torch.save({k: state[k] for k in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return ["config.json", "generation_config.json", "pytorch_model.bin.index.json", *files]


@pytest.fixture(params=["folder", "hub"])
def load(request, monkeypatch, tmp_path):
    """`load(folder, **overrides) -> model`: from the folder, or from the stubbed hub serving it.

    The hub variant checks that exactly `expected` files were downloaded.
    """

    def load_from(folder, expected, **overrides):
        if request.param == "folder":
            return from_pretrained(folder, **overrides)
        downloaded = stub_hub(monkeypatch, folder, tmp_path / "cache")
        model = from_pretrained(HUB_NAME, **overrides)
        assert sorted(downloaded) == sorted(expected)
        return model

    return load_from


def assert_same_weights(ours, reference):
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.slow  # compiles a Translator
def test_pickle_only_marian_matches_transformers(load, tmp_path):
    """The opus-mt layout: only pytorch_model.bin, with tied copies and position tables."""
    hf = make_marian("shared-tied-swish-scaled")
    expected = write_pickled(tmp_path / "repo", hf)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreshWeightsWarning)  # a full checkpoint: nothing fresh
        model = load(tmp_path / "repo", expected)
    ours = batched(model)(jnp_int(SOURCE), jnp_int(TARGET), jnp.asarray(SOURCE_REAL))
    assert max_diff(ours, hf_logits(hf)) <= LOGIT_TOL
    assert np.array_equal(model.output_bias, hf.final_logits_bias[0].numpy())


def test_sharded_pickles_load(load, tmp_path):
    hf = make_bert()
    expected = write_pickled(tmp_path / "repo", hf, shards=2)
    assert_same_weights(load(tmp_path / "repo", expected), from_hf(hf))


def test_bare_gpt2_keys_with_mask_buffers_load(load, tmp_path):
    """The `gpt2` layout: no `transformer.` prefix, `attn.bias`/`attn.masked_bias` buffers, and
    config.json naming GPT2LMHeadModel (whose output is tied to the token table)."""
    hf = make_gpt2("tied-4-heads")
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    del state["lm_head.weight"]
    n = hf.config.n_positions
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.uint8))[None, None]
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    expected = write_pickled(tmp_path / "repo", hf, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreshWeightsWarning)
        model = load(tmp_path / "repo", expected)
    assert_same_weights(model, from_hf(hf))


def test_bert_pretraining_checkpoint_with_gamma_beta_names(load, tmp_path, caplog):
    """The `bert-base-uncased` layout: BertForPreTraining with LayerNorm gamma/beta names,
    loaded as a classifier: the masked-LM head loads (the model can still fill in masks), the
    next-sentence head is left out, the class head is new and said so loudly."""
    hf = make_bert(cls=transformers.BertForPreTraining)
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in hf.state_dict().items()
    }
    assert "bert.embeddings.LayerNorm.gamma" in state and "cls.seq_relationship.weight" in state
    expected = write_pickled(tmp_path / "repo", hf, state)
    with (
        caplog.at_level(logging.WARNING, logger="zoo.interop"),
        pytest.warns(FreshWeightsWarning, match=r"head\.bias, head\.weight") as warned,
    ):
        model = load(tmp_path / "repo", expected, num_classes=2)
    assert "train them before use" in str(warned[0].message)
    assert "a masked-LM checkpoint has no classification head" in caplog.text
    assert "random from `key`): head.bias, head.weight" in caplog.text
    assert model.head.weight.shape == (2, 32) and model.mlm_head is not None
    encoder = {
        k: v.numpy() for k, v in hf.state_dict().items() if not k.startswith("cls.seq_relationship")
    }
    with pytest.warns(FreshWeightsWarning):  # the same fresh head, from the same default key
        reference = load_state_dict(hf.config.to_dict(), encoder, num_classes=2)
    assert_same_weights(model, reference)


@pytest.mark.parametrize(
    ("make", "dropped", "fresh"),
    [
        (lambda: make_marian("shared-tied-swish-scaled"), ["final_logits_bias"], "output_bias"),
        (make_bert, ["classifier.weight", "classifier.bias"], "head.bias, head.weight"),
    ],
    ids=["marian-mt", "bert-classifier"],
)
def test_a_task_checkpoint_without_its_head_is_said_loudly(make, dropped, fresh, caplog):
    """What `AutoModel.from_pretrained(dir).save_pretrained(dir)` leaves of a task model."""
    hf = make()
    arrays = {k: v.numpy() for k, v in hf.state_dict().items() if k not in dropped}
    config = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}
    with (
        caplog.at_level(logging.WARNING, logger="zoo.interop"),
        pytest.warns(FreshWeightsWarning) as warned,
    ):
        load_state_dict(config, arrays)
    message = str(warned[0].message)
    assert (
        f"lacks {', '.join(dropped)}, which every {type(hf).__name__} checkpoint holds" in message
    )
    assert f"initialised {fresh} afresh, so the logits WILL DIFFER" in message
    assert f"convert with transformers.{type(hf).__name__}" in message
    assert message in caplog.text


class CreatesFile:
    """A pickle payload: unpickling it calls open(path, "w"), creating the file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path, writer):
    marker = tmp_path / "created-by-the-payload"
    hf = make_marian("shared-tied-swish-scaled")
    folder = tmp_path / "repo"
    write_pickled(folder, hf)
    state = {"payload": CreatesFile(marker), "final_logits_bias": torch.zeros(1, 47)}
    if writer == "torch.save":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        with open(folder / "pytorch_model.bin", "wb") as handle:
            pickle.dump(state, handle, protocol=2)
    with pytest.raises(ValueError, match="would run code when unpickled") as error:
        from_pretrained(folder)
    assert not marker.exists()
    message = str(error.value)
    assert str(folder / "pytorch_model.bin") in message
    assert "calls io.open" in message and "ran nothing" in message


@pytest.mark.parametrize("cut", [0, 0.5], ids=["empty", "truncated"])
def test_a_damaged_pickle_is_named(tmp_path, cut):
    folder = tmp_path / "repo"
    write_pickled(folder, make_bert())
    path = folder / "pytorch_model.bin"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ValueError, match="download it again") as error:
        from_pretrained(folder)
    assert f"{path} is damaged" in str(error.value)


def test_without_torch_the_error_names_the_extra_and_the_task_class(tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    write_pickled(folder, make_marian("shared-tied-swish-scaled"))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'jax-transformer-zoo\[hf\]'") as error:
        from_pretrained(folder)
    message = str(error.value)
    assert "transformers.MarianMTModel.from_pretrained(DIR).save_pretrained(DIR)" in message
    assert "AutoModel would drop task heads" in message


def test_torch_before_2_6_is_refused_by_version(tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    write_pickled(folder, make_bert())
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.raises(ImportError, match=r"torch 2\.5\.1\+cpu is too old") as error:
        from_pretrained(folder)
    assert "pip install 'torch>=2.6'" in str(error.value)


def test_safetensors_are_preferred_over_pickles_in_a_folder(tmp_path):
    hf = make_bert()
    folder = tmp_path / "repo"
    hf.save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"never read")
    assert_same_weights(from_pretrained(folder), from_hf(hf))
