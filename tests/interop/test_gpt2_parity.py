"""GPT-2 <-> zoo.GPT parity with transformers: logits, parts, generation, export."""

from __future__ import annotations

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
from zoo.interop import UnsupportedConfig, from_hf, from_pretrained, load_state_dict, save_hf, to_hf
from zoo.interop.weights import write_safetensors
from zoo.nn import BlockInputs, Mask

pytestmark = pytest.mark.hf

VARIANTS = {
    "tied-4-heads": dict(n_embd=32, n_head=4, n_layer=2),
    "untied-3-heads-odd": dict(
        n_embd=36, n_head=3, n_layer=3, n_inner=50, tie_word_embeddings=False
    ),
    "gelu-1-head": dict(n_embd=20, n_head=1, n_layer=1, activation_function="gelu"),
}
# right-padded batch: the second row has three padding positions
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 2, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(variant: str, seed: int = 0):
    config = transformers.GPT2Config(
        vocab_size=61, n_positions=40, bos_token_id=1, eos_token_id=2, **VARIANTS[variant]
    )
    torch.manual_seed(seed)
    return randomize(transformers.GPT2LMHeadModel(config), seed=seed)


@eqx.filter_jit
def zoo_outputs(model, tokens, real):
    """Logits, embeddings, layer 0's attention and layer 0's output, batched."""
    block = model.layers.layer(0)

    def one(tokens, real):
        x = model.embedder(tokens, jnp.arange(tokens.shape[0]))
        mask = Mask.keys(real, tokens.shape[0], causal=True)
        attended = block.self_attention(block.self_attention_norm(x), mask=mask)
        return model(tokens, real), x, attended, block(x, BlockInputs(mask=mask))[0]

    return jax.vmap(one)(tokens, real)


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    """One variant run through both libraries: (name, hf model, zoo model, HF outputs, zoo's)."""
    hf = make_hf(request.param)
    model = from_hf(hf)
    attention_out = capture(hf.transformer.h[0].attn)
    block_out = capture(hf.transformer.h[0])
    with torch.no_grad():
        states = hf(tensor(TOKENS), attention_mask=tensor(REAL), output_hidden_states=True)
    theirs = (states.logits, states.hidden_states[0], attention_out[0], block_out[0])
    ours = zoo_outputs(model, jnp_int(TOKENS), jnp.asarray(REAL, bool))
    return request.param, hf, model, theirs, ours


def hf_logits(hf, tokens=TOKENS, real=REAL):
    with torch.no_grad():
        return hf(tensor(tokens), attention_mask=tensor(real)).logits.numpy()


def test_logits_match_on_a_padded_batch(run):
    name, hf, model, theirs, ours = run
    diff = max_diff(ours[0], theirs[0], REAL)
    record("gpt2", diff)
    assert diff <= LOGIT_TOL, f"{name}: {diff}"
    assert model.config.head.tie == hf.config.tie_word_embeddings
    assert (model.head is None) == model.config.head.tie


@pytest.mark.parametrize("part", [1, 2, 3], ids=["embeddings", "attention", "block"])
def test_embeddings_attention_and_block_match(run, part):
    name, _, _, theirs, ours = run
    assert max_diff(ours[part], theirs[part], REAL) <= PART_TOL, name


def test_greedy_generation_matches_transformers():
    hf = make_hf("tied-4-heads", seed=1)
    model = from_hf(hf)
    prompt = np.array([5, 17, 3, 44])
    with torch.no_grad():
        expected = hf.generate(
            tensor(prompt[None]),
            attention_mask=torch.ones(1, 4, dtype=torch.long),
            max_new_tokens=20,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            pad_token_id=0,
        )[0, 4:].tolist()
    extend = eqx.filter_jit(type(model).extend)
    logits, cache = extend(model, jnp_int(prompt), model.init_cache(24))
    generated = [int(jnp.argmax(logits[-1]))]
    for _ in range(19):
        logits, cache = extend(model, jnp_int([generated[-1]]), cache)
        generated.append(int(jnp.argmax(logits[-1])))
    assert len(expected) == 20
    assert generated == expected
    assert len(set(generated)) > 3  # a real sequence, not one token repeated


def test_to_hf_state_dict_loads_strictly_and_matches(run):
    name, hf, model, _, _ = run
    state_dict, config = to_hf(model)
    assert set(state_dict) == set(hf.state_dict())
    exported = transformers.GPT2LMHeadModel(config).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(exported), hf_logits(hf), REAL) <= 1e-6, name


def test_save_hf_folder_loads_in_transformers_and_zoo(tmp_path):
    hf = make_hf("untied-3-heads-odd")
    model = from_hf(hf)
    save_hf(model, tmp_path)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(reloaded), hf_logits(hf), REAL) <= 1e-6
    again = from_pretrained(tmp_path)
    assert again.config == model.config
    for ours, theirs in zip(jax.tree.leaves(again), jax.tree.leaves(model)):
        assert np.array_equal(ours, theirs)


def test_hub_layout_without_prefix_and_with_mask_buffers_loads(tmp_path):
    """The `gpt2` hub file: bare GPT2Model keys, causal-mask buffers, no lm_head."""
    hf = make_hf("tied-4-heads")
    arrays = {k: v.numpy() for k, v in hf.transformer.state_dict().items()}
    for i in range(hf.config.n_layer):
        arrays[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
        arrays[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    write_safetensors(arrays, tmp_path / "model.safetensors")
    hf.config.to_json_file(tmp_path / "config.json")
    model = from_pretrained(tmp_path)
    logits = zoo_outputs(model, jnp_int(TOKENS), jnp.asarray(REAL, bool))[0]
    diff = max_diff(logits, hf_logits(hf), REAL)
    assert diff <= LOGIT_TOL


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("scale_attn_weights", False),
        ("add_cross_attention", True),
        ("activation_function", "quick_gelu"),
    ],
)
def test_options_that_change_the_computation_are_refused(option, value):
    config = {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, option: value}
    with pytest.raises(UnsupportedConfig, match=option):
        load_state_dict(config, {})


def test_other_gpt2_heads_are_refused():
    config = {"model_type": "gpt2", "architectures": ["GPT2ForTokenClassification"]}
    with pytest.raises(UnsupportedConfig, match="GPT2ForTokenClassification"):
        load_state_dict(config, {})


def test_zoo_entry_points_are_the_interop_functions():
    assert zoo.from_hf is from_hf and zoo.to_hf is to_hf and zoo.from_pretrained is from_pretrained
    assert jax.tree_util.tree_leaves(from_hf(make_hf("gelu-1-head")))
