"""Masked-LM heads: `BertForMaskedLM`, `RobertaForMaskedLM`, `DistilBertForMaskedLM` checkpoints
load with their heads (`cls.predictions.*`, `lm_head.*`, `vocab_*`) and match transformers."""

from __future__ import annotations

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, jnp_int, max_diff, randomize, record, tensor, torch, transformers

from zoo.interop import from_pretrained, save_hf, to_hf

pytestmark = pytest.mark.hf

SHAPES = dict(vocab_size=53, max_position_embeddings=24)
FAMILIES = {  # family -> (class prefix, config fields, pad id)
    "bert": ("Bert", dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                          intermediate_size=37), 0),
    "roberta": ("Roberta", dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                                intermediate_size=37, type_vocab_size=1), 1),
    "distilbert": ("DistilBert", dict(dim=32, n_heads=4, n_layers=2, hidden_dim=37), 0),
}  # fmt: skip
ROWS = np.array([[2, 17, 4, 44, 8, 21, 9, 3], [2, 7, 33, 3, -1, -1, -1, -1]])


def batch(family: str) -> tuple[np.ndarray, np.ndarray]:
    return np.where(ROWS < 0, FAMILIES[family][2], ROWS), ROWS >= 0


@eqx.filter_jit
def zoo_mlm_logits(model, tokens, real):
    return jax.vmap(model.masked_lm_logits)(tokens, real)


def hf_mlm_logits(hf, family: str) -> np.ndarray:
    tokens, real = batch(family)
    with torch.no_grad():
        return hf(tensor(tokens), attention_mask=tensor(real.astype(int))).logits.numpy()


@pytest.fixture(scope="module", params=list(FAMILIES))
def run(request, tmp_path_factory):
    family = request.param
    prefix, fields, _ = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**SHAPES, **fields)
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, f"{prefix}ForMaskedLM")(config))
    folder = tmp_path_factory.mktemp(family)
    hf.save_pretrained(folder)
    return family, hf, folder


def test_masked_lm_logits_match(run, caplog):
    family, hf, folder = run
    with caplog.at_level(logging.WARNING, logger="zoo.interop"):
        model = from_pretrained(folder)
    assert "no classification head" in caplog.text and "initialised fresh" in caplog.text
    assert model.config.masked_lm and model.mlm_head is not None
    tokens, real = batch(family)
    ours = zoo_mlm_logits(model, jnp_int(tokens), jnp.asarray(real))
    diff = max_diff(ours, hf_mlm_logits(hf, family), real)
    record(f"{family} masked LM", diff)
    assert diff <= LOGIT_TOL


def test_to_hf_round_trip_is_the_masked_lm_class(run, tmp_path):
    family, hf, folder = run
    model = from_pretrained(folder)
    state_dict, config = to_hf(model)
    assert config.architectures == [type(hf).__name__]
    assert set(state_dict) == set(hf.state_dict())
    exported = type(hf)(type(hf.config)(**config.to_dict())).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_mlm_logits(exported, family), hf_mlm_logits(hf, family)) <= 1e-6
    save_hf(model, tmp_path)
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert max_diff(hf_mlm_logits(reloaded, family), hf_mlm_logits(hf, family)) <= 1e-6


def test_the_masked_lm_head_can_be_left_out(run):
    _, _, folder = run
    model = from_pretrained(folder, masked_lm=False, num_classes=2)
    assert model.mlm_head is None and model.head.weight.shape == (2, 32)
