"""BERT <-> zoo.Classifier parity with transformers: logits, parts, heads, export."""

from __future__ import annotations

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import (
    LOGIT_TOL,
    PART_TOL,
    capture,
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
    UnsupportedConfig,
    UnsupportedExport,
    from_hf,
    from_pretrained,
    load_state_dict,
    save_hf,
    to_hf,
)
from zoo.nn import BlockInputs, Mask

pytestmark = pytest.mark.hf

VARIANTS = {
    "4-heads-3-classes": dict(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=37
    ),
    "odd-2-heads-5-classes": dict(
        hidden_size=26,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=45,
        type_vocab_size=3,
        hidden_act="gelu_new",
        num_labels=5,
    ),
}
TOKENS = np.array([[2, 17, 3, 44, 8, 21, 9, 3], [2, 7, 33, 3, 40, 3, 0, 0]])
TYPES = np.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]])
REAL = TOKENS != 0


def hf_config(variant: str = "4-heads-3-classes") -> transformers.BertConfig:
    fields = {"num_labels": 3, "vocab_size": 53, "max_position_embeddings": 24}
    return transformers.BertConfig(**{**fields, **VARIANTS[variant]})


def make_hf(variant: str = "4-heads-3-classes", cls=None, **kwargs):
    torch.manual_seed(0)
    cls = transformers.BertForSequenceClassification if cls is None else cls
    return randomize(cls(hf_config(variant), **kwargs))


@eqx.filter_jit
def zoo_outputs(model, tokens, types, real):
    """Logits, embeddings, layer 0's attention and layer 0's output, batched."""
    block = model.encoder.layer(0)

    def one(tokens, types, real):
        x = model.embedder(tokens, jnp.arange(tokens.shape[0]), types)
        mask = Mask.keys(real, tokens.shape[0])
        attended = block.self_attention(x, mask=mask)
        return model(tokens, real, types), x, attended, block(x, BlockInputs(mask=mask))[0]

    return jax.vmap(one)(tokens, types, real)


@eqx.filter_jit
def zoo_encode(model, tokens, real):
    """Per-position hidden states and the pooled vector, batched."""

    def one(tokens, real):
        hidden = model.encode(tokens, real)
        return hidden, model.pool(hidden, real)

    return jax.vmap(one)(tokens, real)


def hf_logits(hf):
    with torch.no_grad():
        return hf(tensor(TOKENS), tensor(REAL.astype(int)), tensor(TYPES)).logits.numpy()


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    hf = make_hf(request.param)
    model = from_hf(hf)
    attention_out = capture(hf.bert.encoder.layer[0].attention.output.dense)
    block_out = capture(hf.bert.encoder.layer[0])
    with torch.no_grad():
        states = hf(
            tensor(TOKENS), tensor(REAL.astype(int)), tensor(TYPES), output_hidden_states=True
        )
    theirs = (states.logits, states.hidden_states[0], attention_out[0], block_out[0])
    ours = zoo_outputs(model, jnp_int(TOKENS), jnp_int(TYPES), jnp.asarray(REAL))
    return request.param, hf, model, theirs, ours


def test_logits_match_on_a_padded_batch(run):
    name, hf, model, theirs, ours = run
    diff = max_diff(ours[0], theirs[0])
    record("bert", diff)
    assert diff <= LOGIT_TOL, f"{name}: {diff}"
    assert model.config.num_classes == hf.config.num_labels
    block = model.config.layers.block
    assert block.norm.eps == 1e-12 and not block.norm_first


@pytest.mark.parametrize("part", [1, 2, 3], ids=["embeddings", "attention", "block"])
def test_embeddings_attention_and_block_match(run, part):
    name, _, _, theirs, ours = run
    assert max_diff(ours[part], theirs[part], REAL) <= PART_TOL, name


def test_bare_bert_model_gets_a_fresh_head(tmp_path, caplog):
    hf = make_hf(cls=transformers.BertModel)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    with caplog.at_level(logging.WARNING, logger="zoo.interop"):
        model = from_pretrained(tmp_path, num_classes=2)
    assert "head.weight" in caplog.text
    assert model.head.weight.shape == (2, 32) and model.pooler is not None
    with torch.no_grad():
        out = hf(tensor(TOKENS), tensor(REAL.astype(int)))
    hidden, pooled = zoo_encode(model, jnp_int(TOKENS), jnp.asarray(REAL))
    assert max_diff(hidden, out.last_hidden_state, REAL) <= LOGIT_TOL
    assert max_diff(pooled, out.pooler_output) <= LOGIT_TOL


def test_bert_model_without_pooler_loads_without_pooler():
    hf = make_hf(cls=transformers.BertModel, add_pooling_layer=False)
    model = from_hf(hf, num_classes=4)
    assert model.pooler is None and model.config.head.pooler is None
    with torch.no_grad():
        expected = hf(tensor(TOKENS), tensor(REAL.astype(int))).last_hidden_state
    hidden, pooled = zoo_encode(model, jnp_int(TOKENS), jnp.asarray(REAL))
    assert max_diff(hidden, expected, REAL) <= LOGIT_TOL
    assert max_diff(pooled, expected[:, 0]) <= LOGIT_TOL  # pooling="first", no dense+tanh


def test_a_head_with_other_classes_is_reinitialised_with_a_warning(caplog):
    hf = make_hf()
    loaded = from_hf(hf)
    with caplog.at_level(logging.WARNING, logger="zoo.interop"):
        resized = from_hf(hf, num_classes=7)
    assert "3 classes but num_classes=7" in caplog.text
    assert resized.head.weight.shape == (7, 32)
    for ours, theirs in zip(jax.tree.leaves(resized.encoder), jax.tree.leaves(loaded.encoder)):
        assert np.array_equal(ours, theirs)


def test_pretraining_checkpoint_keys_load():
    """bert-base-uncased style: gamma/beta LayerNorm names, MLM and NSP heads, position ids."""
    hf = make_hf()
    arrays = {}
    for key, value in hf.state_dict().items():
        if key.startswith("classifier."):
            continue
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma")
        arrays[key.replace("LayerNorm.bias", "LayerNorm.beta")] = value.numpy()
    arrays["bert.embeddings.position_ids"] = np.arange(24)[None]
    arrays["cls.predictions.bias"] = np.zeros(53, np.float32)
    arrays["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)
    config = {**hf.config.to_dict(), "architectures": ["BertForPreTraining"]}
    model = load_state_dict(config, arrays, num_classes=2)
    reference = from_hf(hf)
    for ours, theirs in zip(jax.tree.leaves(model.encoder), jax.tree.leaves(reference.encoder)):
        assert np.array_equal(ours, theirs)
    assert np.array_equal(model.embedder.norm.weight, reference.embedder.norm.weight)


def test_to_hf_and_save_hf_load_in_transformers(run, tmp_path):
    name, hf, model, _, _ = run
    state_dict, config = to_hf(model)
    assert set(state_dict) == set(hf.state_dict())
    exported = transformers.BertForSequenceClassification(config).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(exported), hf_logits(hf)) <= 1e-6, name
    save_hf(model, tmp_path)
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(reloaded), hf_logits(hf)) <= 1e-6, name


def test_export_refuses_what_bert_cannot_express():
    model = zoo.presets.abstract("classifier-tiny")  # shapes only: export refuses first
    with pytest.raises(UnsupportedExport, match="pooler") as error:
        to_hf(model)
    assert "norm_first" in str(error.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("position_embedding_type", "relative_key"),
        ("is_decoder", True),
        ("add_cross_attention", True),
        ("hidden_act", "quick_gelu"),
        ("architectures", ["BertForTokenClassification"]),
    ],
)
def test_options_that_change_the_computation_are_refused(option, value):
    with pytest.raises(UnsupportedConfig, match=option):
        load_state_dict({"model_type": "bert", option: value}, {})
