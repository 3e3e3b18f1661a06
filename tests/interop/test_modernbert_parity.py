"""ModernBERT <-> zoo.Classifier parity with transformers.

Tiny random models with local layers whose two-sided window is shorter than the sequence, a
rotary base per layer kind, GeGLU from the fused `mlp.Wi`, the fused `attn.Wqkv`, LayerNorms
with and without bias, no norm before layer 0's attention, and the classification head (dense,
GELU, norm) on the [CLS] vector or the mean over real tokens. Logits on a right-padded batch
(scanned and unrolled stacks), a `save_pretrained` folder, a folder with the hub's config
spelling, the bare encoder's hidden states, and export back to transformers.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, max_diff, randomize, record, tensor, torch, transformers_count
from hf_helpers import transformers as hf_transformers

from zoo.interop import from_hf, from_pretrained, to_hf
from zoo.interop.loading import FreshWeightsWarning
from zoo.interop.weights import write_safetensors
from zoo.models import ClassifierConfig

pytestmark = pytest.mark.hf

SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
    local_attention=4,  # local layers see 2 positions either side of 9-token sequences
    num_labels=3,
)
VARIANTS = {
    "cls": dict(classifier_pooling="cls", global_rope_theta=1000.0, local_rope_theta=50.0),
    "mean-biases": dict(
        classifier_pooling="mean",
        global_attn_every_n_layers=2,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
        classifier_activation="gelu",
    ),
}
TOKENS = np.array([[1, 17, 3, 44, 8, 21, 9, 30, 2], [1, 7, 33, 4, 40, 2, 0, 0, 0]])
REAL = np.array([[1] * 9, [1] * 6 + [0] * 3])


def make_hf(variant: str, class_name: str = "ModernBertForSequenceClassification"):
    config = hf_transformers.ModernBertConfig(**SMALL, **VARIANTS[variant])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(getattr(hf_transformers, class_name)(config))


def global_layers(config: ClassifierConfig) -> tuple[int, ...]:
    """The layers without a window (ModernBERT's global layers)."""
    return tuple(i for i, s in enumerate(config.layers.layers()) if s.attention.window is None)


def hf_logits(hf) -> np.ndarray:
    with torch.no_grad():
        return hf(tensor(TOKENS), attention_mask=tensor(REAL)).logits.float().numpy()


def zoo_logits(model) -> np.ndarray:
    return np.asarray(jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool)))


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sequence_classification_logits_match(variant, layer_loop):
    hf = make_hf(variant)
    model = from_hf(hf, layer_loop=layer_loop)
    c = model.config
    assert (c.head.pooling, c.layers.layer(0).attention_norm, c.layers.block.norm.bias) == (
        "first" if variant == "cls" else "mean",
        False,
        variant != "cls",
    )
    assert c.layers.block.attention.window == 3  # |i - j| <= local_attention // 2
    assert global_layers(c) == ((0, 3) if variant == "cls" else (0, 2))
    diff = max_diff(zoo_logits(model), hf_logits(hf))
    record(f"modernbert-{variant}", diff)
    assert diff < LOGIT_TOL


def test_the_window_matters_and_is_two_sided():
    """A model whose local layers saw every position would compute other logits."""
    hf = make_hf("cls")
    model = from_hf(hf)
    wide = from_hf(hf, **{"attention.window": 64})
    assert max_diff(zoo_logits(wide), hf_logits(hf)) > 1e-3
    assert max_diff(zoo_logits(model), hf_logits(hf)) < LOGIT_TOL


def test_save_pretrained_folder_loads(tmp_path):
    hf = make_hf("mean-biases")
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    assert max_diff(zoo_logits(model), hf_logits(hf)) < LOGIT_TOL


def test_hub_shaped_folder_loads(tmp_path):
    """config.json as the hub writes ModernBERT's (the older flat fields), safetensors weights."""
    hub = dict(
        architectures=["ModernBertForSequenceClassification"],
        model_type="modernbert",
        vocab_size=61,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_activation="gelu",
        global_attn_every_n_layers=3,
        local_attention=4,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        norm_bias=False,
        norm_eps=1e-05,
        attention_bias=False,
        mlp_bias=False,
        classifier_pooling="mean",
        classifier_activation="gelu",
        classifier_bias=False,
        classifier_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        initializer_range=0.02,
        initializer_cutoff_factor=2.0,
        deterministic_flash_attn=False,
        sparse_prediction=False,
        sparse_pred_ignore_index=-100,
        reference_compile=None,
        torch_dtype="float32",
        id2label={"0": "negative", "1": "neutral", "2": "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    (tmp_path / "config.json").write_text(json.dumps(hub))
    config = hf_transformers.AutoConfig.from_pretrained(tmp_path)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    hf = randomize(hf_transformers.ModernBertForSequenceClassification(config), seed=1)
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    write_safetensors(state, tmp_path / "model.safetensors")
    model = from_pretrained(tmp_path)
    local_rope = model.config.layers.block.attention.rope  # the local layers' (the base block's)
    assert model.config.num_classes == 3 and local_rope.theta == 10000.0
    diff = max_diff(zoo_logits(model), hf_logits(hf))
    record("modernbert-hub", diff)
    assert diff < LOGIT_TOL


def test_bare_encoder_hidden_states_match():
    hf = make_hf("cls", "ModernBertModel")
    with pytest.warns(FreshWeightsWarning, match="pooler"):
        model = from_hf(hf)
    with torch.no_grad():
        theirs = hf(tensor(TOKENS), attention_mask=tensor(REAL)).last_hidden_state.numpy()
    ours = jax.vmap(model.encode)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    assert max_diff(np.asarray(ours), theirs, REAL) < LOGIT_TOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_loads_strictly_into_transformers(variant):
    hf = make_hf(variant)
    model = from_hf(hf)
    state, config = to_hf(model)
    assert "model.layers.0.attn_norm.weight" not in state
    assert set(state) == set(hf.state_dict())
    back = hf_transformers.ModernBertForSequenceClassification(config)
    back.load_state_dict(state, strict=True)
    back.config._attn_implementation = "eager"
    assert max_diff(hf_logits(back.eval()), hf_logits(hf)) < LOGIT_TOL


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("modernbert-tiny", 38_274),
        ("modernbert-base", 149_606_402),
        ("modernbert-large", 395_833_346),
    ],
)
def test_preset_counts_equal_transformers(name, count):
    """transformers' count (ModernBertForSequenceClassification on the meta device) is zoo's:
    the first layer, a group of its own in the stack, has no attention norm."""
    import zoo

    assert transformers_count(zoo.presets.config(name)) == (
        "ModernBertForSequenceClassification",
        count,
    )
    assert zoo.presets.param_count(name) == count


def test_masked_lm_checkpoint_keeps_its_head_as_the_pooler():
    """`ModernBertForMaskedLM`'s `head.*` is the same dense -> GELU -> norm as the sequence
    classifier's: it loads as the pooler; the class head starts fresh, the decoder is left out."""
    hf = make_hf("cls", "ModernBertForMaskedLM")
    with pytest.warns(FreshWeightsWarning, match=r"head\.weight") as caught:
        model = from_hf(hf)
    assert "pooler" not in str(caught[0].message)
    np.testing.assert_array_equal(
        np.asarray(model.pooler.weight), hf.head.dense.weight.detach().numpy()
    )
    with torch.no_grad():
        theirs = hf.model(tensor(TOKENS), attention_mask=tensor(REAL)).last_hidden_state.numpy()
    ours = jax.vmap(model.encode)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))
    assert max_diff(np.asarray(ours), theirs, REAL) < LOGIT_TOL
