"""RoBERTa, XLM-R and DistilBERT <-> zoo.Classifier parity with transformers: logits on padded
batches (left padding too), bare base models with a fresh head, export, preset counts."""

from __future__ import annotations

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import (
    LOGIT_TOL,
    check_preset_count,
    jnp_int,
    max_diff,
    randomize,
    record,
    tensor,
    torch,
    transformers,
)

import zoo
from zoo.interop import (
    FreshWeightsWarning,
    UnsupportedConfig,
    UnsupportedExport,
    from_hf,
    from_pretrained,
    load_state_dict,
    save_hf,
    to_hf,
)

pytestmark = pytest.mark.hf

SHAPES = dict(vocab_size=53, max_position_embeddings=24, num_labels=3)
# family -> (config class, its fields, the class prefix, pad id)
FAMILIES = {
    "roberta": (
        "RobertaConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=37,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
        ),
        "Roberta",
        1,
    ),
    "xlm-roberta": (
        "XLMRobertaConfig",
        dict(
            hidden_size=26,
            num_attention_heads=2,
            num_hidden_layers=1,
            intermediate_size=45,
            type_vocab_size=1,
            hidden_act="gelu_new",
        ),
        "XLMRoberta",
        1,
    ),
    "distilbert": (
        "DistilBertConfig",
        dict(dim=32, n_heads=4, n_layers=2, hidden_dim=37, activation="gelu"),
        "DistilBert",
        0,
    ),
}
# -1 marks padding: right-padded, unpadded, and left-padded rows (RoBERTa's positions skip pads)
ROWS = np.array(
    [[0, 17, 3, 44, 8, 21, 9, 2], [0, 7, 33, 2, -1, -1, -1, -1], [-1, -1, 0, 5, 6, 7, 8, 2]]
)


def batch(family: str) -> tuple[np.ndarray, np.ndarray]:
    pad = FAMILIES[family][3]
    return np.where(ROWS < 0, pad, ROWS), ROWS >= 0


def make_hf(family: str, task: str = "ForSequenceClassification", **fields):
    config_class, shapes, prefix, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SHAPES, **shapes, **fields})
    torch.manual_seed(0)
    return randomize(getattr(transformers, f"{prefix}{task}")(config))


def hf_logits(hf, family: str) -> np.ndarray:
    tokens, real = batch(family)
    with torch.no_grad():
        return hf(tensor(tokens), attention_mask=tensor(real.astype(int))).logits.numpy()


@eqx.filter_jit
def zoo_logits(model, tokens, real):
    return jax.vmap(model)(tokens, real)


@eqx.filter_jit
def zoo_hidden(model, tokens, real):
    return jax.vmap(model.encode)(tokens, real)


def ours(model, family: str):
    tokens, real = batch(family)
    return zoo_logits(model, jnp_int(tokens), jnp.asarray(real))


@pytest.fixture(scope="module", params=list(FAMILIES))
def run(request, tmp_path_factory):
    family = request.param
    hf = make_hf(family)
    folder = tmp_path_factory.mktemp(family)
    hf.save_pretrained(folder)
    return family, hf, from_pretrained(folder)


def test_logits_match_on_padded_batches(run):
    family, hf, model = run
    diff = max_diff(ours(model, family), hf_logits(hf, family))
    record(family, diff)
    assert diff <= LOGIT_TOL, family
    assert model.config.num_classes == 3


def test_each_family_is_its_parts(run):
    family, _, model = run
    c = model.config
    parts = (c.embedder.type_vocab_size, c.head.pooler.activation, c.embedder.position_offset)
    if family == "distilbert":
        assert parts == (0, "relu", 0)
        assert c.head.dropout == 0.2 and c.layers.block.norm.eps == 1e-12
    else:
        assert parts == (1, "tanh", 2)
        assert c.pad_id == 1 and c.max_tokens == 22


@pytest.mark.parametrize("family", list(FAMILIES))
def test_base_model_loads_with_a_fresh_head(family, tmp_path, caplog):
    hf = make_hf(family, "Model")
    hf.save_pretrained(tmp_path)
    warns = pytest.warns(FreshWeightsWarning, match="head.weight")
    with caplog.at_level(logging.WARNING, logger="zoo.interop"), warns:
        model = from_pretrained(tmp_path, num_classes=2)
    assert "pooler.weight" in caplog.text  # the head's dense layer starts fresh too
    assert model.head.weight.shape == (2, hf.config.hidden_size)
    tokens, real = batch(family)
    with torch.no_grad():
        expected = hf(tensor(tokens), attention_mask=tensor(real.astype(int))).last_hidden_state
    hidden = zoo_hidden(model, jnp_int(tokens), jnp.asarray(real))
    assert max_diff(hidden, expected, real) <= LOGIT_TOL


def test_to_hf_and_save_hf_load_in_transformers(run, tmp_path):
    family, hf, model = run
    state_dict, config = to_hf(model)
    assert set(state_dict) == set(hf.state_dict())
    prefix = FAMILIES[family][2]
    hf_class = getattr(transformers, f"{prefix}ForSequenceClassification")
    exported = hf_class(getattr(transformers, FAMILIES[family][0])(**config.to_dict())).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(exported, family), hf_logits(hf, family)) <= 1e-6
    save_hf(model, tmp_path)
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(reloaded, family), hf_logits(hf, family)) <= 1e-6
    assert max_diff(ours(from_pretrained(tmp_path), family), hf_logits(hf, family)) <= LOGIT_TOL


# preset -> (transformers class, its parameter count with two labels)
PRESET_CLASSES = {
    "roberta-base": ("RobertaForSequenceClassification", 124_647_170),
    "xlm-roberta-base": ("RobertaForSequenceClassification", 278_045_186),
    "distilbert-base": ("DistilBertForSequenceClassification", 66_955_010),
    "bert-base": ("BertForSequenceClassification", 109_483_778),
}


@pytest.mark.parametrize("name", list(PRESET_CLASSES))
def test_preset_counts_equal_transformers(name):
    check_preset_count(name, *PRESET_CLASSES[name])


def test_roberta_positions_count_real_tokens_from_pad_plus_one():
    """Left padding leaves the real tokens' logits unchanged (their positions start at 2)."""
    hf = make_hf("roberta")
    model = from_hf(hf)
    alone = model(jnp.array([0, 5, 6, 7, 8, 2]))
    left = model(jnp.array([1, 1, 0, 5, 6, 7, 8, 2]))
    # the first token is padding in `left`: compare the real tokens' hidden states instead
    hidden = model.encode(jnp.array([1, 1, 0, 5, 6, 7, 8, 2]))[2:]
    assert max_diff(hidden, model.encode(jnp.array([0, 5, 6, 7, 8, 2]))) <= 1e-5
    assert alone.shape == left.shape == (3,)
    with pytest.raises(ValueError, match="max_positions=22"):
        model(jnp.zeros(23, jnp.int32))


@pytest.mark.parametrize(
    ("model_type", "option", "value"),
    [
        ("distilbert", "sinusoidal_pos_embds", True),
        ("roberta", "position_embedding_type", "relative_key"),
        ("xlm-roberta", "architectures", ["XLMRobertaForTokenClassification"]),
        ("distilbert", "activation", "quick_gelu"),
    ],
)
def test_options_that_change_the_computation_are_refused(model_type, option, value):
    with pytest.raises(UnsupportedConfig, match=option):
        load_state_dict({"model_type": model_type, option: value}, {})


def test_export_refuses_what_the_family_cannot_express():
    roberta = zoo.presets.abstract("roberta-base", pad_id=3)  # offset 2 no longer pad_id + 1
    with pytest.raises(UnsupportedExport, match="position_offset=2"):
        to_hf(roberta)
    distil = zoo.presets.abstract("distilbert-base", **{"norm.eps": 1e-5})
    with pytest.raises(UnsupportedExport, match="norm.eps"):
        to_hf(distil)
