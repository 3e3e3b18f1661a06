"""SmolLM3 and OLMo 3 <-> zoo.GPT parity with transformers.

Tiny random models of each: SmolLM3 with a NoPE layer every fourth (its default), SmolLM3 with
sliding windows on its NoPE layers (and biases on its projections), and OLMo 3 with three sliding layers to one full one whose
rotary alone is stretched by YaRN (past 4 positions, so 8 tokens reach it). Logits on a padded
batch, cached decoding, greedy generation, export both ways, the hub's spelling of config.json,
refusals by name, and the published presets' parameter counts.
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, check_preset_count, max_diff, randomize, record, tensor, torch
from hf_helpers import transformers as hf_transformers

import zoo
from zoo.interop import UnsupportedConfig, from_hf, from_pretrained, load_state_dict, save_hf, to_hf
from zoo.interop.weights import write_safetensors

pytestmark = pytest.mark.hf

SMALL = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    vocab_size=61,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
# config.json as the hub writes each (transformers 4.5x spelling: rope_theta + rope_scaling)
VARIANTS = {
    "smollm3": dict(
        SMALL,
        model_type="smollm3",
        architectures=["SmolLM3ForCausalLM"],
        tie_word_embeddings=True,
        no_rope_layers=[1, 1, 1, 0],
        use_sliding_window=False,
        sliding_window=None,
    ),
    "smollm3-window": dict(
        SMALL,
        model_type="smollm3",
        architectures=["SmolLM3ForCausalLM"],
        tie_word_embeddings=False,
        no_rope_layer_interval=2,  # NoPE on layers 1 and 3, which slide
        attention_bias=True,
        mlp_bias=True,
        use_sliding_window=True,
        sliding_window=3,
    ),
    "olmo3": dict(
        SMALL,
        model_type="olmo3",
        architectures=["Olmo3ForCausalLM"],
        tie_word_embeddings=False,
        sliding_window=3,
        rope_theta=500000.0,  # transformers 5 reads the hub's spelling with this for the sliding layers
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    ),
}
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 4, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(variant: str, seed: int = 0):
    config = hf_transformers.AutoConfig.for_model(**VARIANTS[variant])
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    cls = getattr(hf_transformers, VARIANTS[variant]["architectures"][0])
    return randomize(cls(config), seed=seed)


def hf_logits(hf) -> np.ndarray:
    with torch.no_grad():
        return hf(tensor(TOKENS), attention_mask=tensor(REAL)).logits.float().numpy()


@eqx.filter_jit
def zoo_logits(model):
    return jax.vmap(model)(jnp.asarray(TOKENS), jnp.asarray(REAL, bool))


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    hf = make_hf(request.param)
    return request.param, hf, from_hf(hf), hf_logits(hf)


def layer_calls(config) -> list[tuple[int | None, object]]:
    """(window, rotary scaling or "none") of each layer."""
    return [
        (s.attention.window, "none" if s.attention.rope is None else s.attention.rope.scaling)
        for s in config.layers.layers()
    ]


EXPECTED_LAYERS = {
    "smollm3": [(None, None)] * 3 + [(None, "none")],
    "smollm3-window": [(None, None), (3, "none")] * 2,
    "olmo3": [(3, None)] * 3 + [(None, "yarn")],
}


def test_logits_match_on_a_padded_batch_and_the_layers_differ_as_configured(run):
    variant, _, model, theirs = run
    assert layer_calls(model.config) == EXPECTED_LAYERS[variant]
    assert model.config.layers.block.norm_first == (variant != "olmo3")
    diff = max_diff(zoo_logits(model), theirs, REAL)
    record(variant, diff)
    assert diff < LOGIT_TOL


def test_cached_decoding_equals_the_full_forward(run):
    _, _, model, _ = run
    tokens = jnp.asarray(TOKENS[0])
    logits, cache = eqx.filter_jit(model.prefill)(tokens[:5], 16)
    pieces, extend = [logits], eqx.filter_jit(model.extend)
    for index in range(5, 8):
        logits, cache = extend(tokens[index : index + 1], cache)
        pieces.append(logits)
    assert max_diff(jnp.concatenate(pieces), model(tokens)) < LOGIT_TOL


def test_greedy_generation_with_left_padding_matches_transformers(run):
    _, hf, _, _ = run
    prompts = [[5, 17, 3, 44, 8, 21], [12, 7, 33]]
    left = np.array([[0] * (6 - len(p)) + p for p in prompts])
    with torch.no_grad():
        theirs = hf.generate(
            tensor(left),
            attention_mask=tensor((left != 0).astype(int)),
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )[:, 6:].numpy()
    ours = zoo.generate(from_hf(hf, eos_id=None), prompts, max_new_tokens=10)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_export_loads_strictly_in_transformers_and_save_hf_round_trips(run, tmp_path):
    _, hf, model, theirs = run
    state_dict, config = to_hf(model)
    config._attn_implementation = "eager"
    again = type(hf)(config).eval()
    again.load_state_dict(state_dict, strict=not config.tie_word_embeddings)
    assert max_diff(hf_logits(again), theirs, REAL) < LOGIT_TOL
    save_hf(model, tmp_path)
    loaded = hf_transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    assert type(loaded) is type(hf)
    assert max_diff(hf_logits(loaded), theirs, REAL) < LOGIT_TOL


def test_a_hub_folder_in_the_hubs_spelling_loads_as_transformers_reads_it(run, tmp_path):
    variant, hf, _, _ = run
    (tmp_path / "config.json").write_text(json.dumps(VARIANTS[variant]))
    arrays = {k: v.numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        arrays.pop("lm_head.weight")
    write_safetensors(arrays, tmp_path / "model.safetensors")
    reference = hf_transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = from_pretrained(tmp_path)
    assert layer_calls(model.config) == EXPECTED_LAYERS[variant]
    assert max_diff(zoo_logits(model), hf_logits(reference), REAL) < LOGIT_TOL


@pytest.mark.parametrize(
    ("variant", "field", "value", "message"),
    [
        ("smollm3", "no_rope_layers", [1, 0], "no_rope_layers"),
        ("smollm3", "no_rope_layers", [1, 2, 1, 0], "no_rope_layers"),
        ("smollm3-window", "sliding_window", None, "sliding_window"),
        ("smollm3-window", "layer_types", ["sliding_attention"] * 3, "layer_types"),
        ("smollm3", "rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope_scaling"),
        ("olmo3", "layer_types", ["sliding_attention", "chunked_attention"] * 2, "layer_types"),
        ("olmo3", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_parameters"),
        ("olmo3", "rope_parameters", {"rope_type": "default"}, "rope_parameters"),
        ("olmo3", "mlp_bias", True, "mlp_bias"),
    ],
)
def test_options_that_change_the_computation_are_refused_by_name(variant, field, value, message):
    config = dict(VARIANTS[variant], **{field: value})
    if field == "sliding_window":
        config["layer_types"] = ["full_attention", "sliding_attention"] * 2
    with pytest.raises(UnsupportedConfig, match=message):
        load_state_dict(config, {})


def test_export_refuses_layers_the_families_cannot_express():
    from zoo.interop.architecture import UnsupportedExport
    from zoo.nn.plan import LayerOverride
    from zoo.nn.rotary import Rope

    other_base = (LayerOverride(changes={"attention.rope": Rope(theta=99.0)}, layers=(1,)),)
    smollm3 = zoo.presets.config("smollm3-tiny").replace(
        **{"layers.overrides": (*zoo.presets.config("smollm3-tiny").layers.overrides, *other_base)}
    )
    with pytest.raises(UnsupportedExport, match="one rotary setting"):
        to_hf(zoo.build(smollm3, key=jax.random.key(0)))
    two_windows = (LayerOverride(changes={"attention.window": 5}, layers=(0,)),)
    olmo3 = zoo.presets.config("olmo3-tiny")
    olmo3 = olmo3.replace(**{"layers.overrides": (*olmo3.layers.overrides, *two_windows)})
    with pytest.raises(UnsupportedExport, match="one sliding_window"):
        to_hf(zoo.build(olmo3, key=jax.random.key(0)))


@pytest.mark.parametrize(
    ("name", "class_name", "count"),
    [
        ("smollm3-3b", "SmolLM3ForCausalLM", 3_075_098_624),
        ("olmo3-7b", "Olmo3ForCausalLM", 7_298_011_136),
    ],
)
def test_preset_counts_equal_transformers(name, class_name, count):
    check_preset_count(name, class_name, count)
