"""Gemma 2 and Gemma 3 (text) <-> zoo.GPT parity with transformers.

Tiny random models varied over the parts that make Gemma: sandwich norms by `1 + weight`,
scaled embeddings, GeGLU, `query_pre_attn_scalar` unlike head_dim, attention and final logit
soft-capping (Gemma 2), sliding and full layers with a window shorter than the sequence, a
second rotary base for the sliding layers and per-head QK-norm (Gemma 3). Logits on a padded
batch (scanned and unrolled stacks), cached decoding, greedy generation, export both ways, a
sharded bf16 folder with the hub's config spelling, and the presets' parameter counts.
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, check_preset_count, max_diff, randomize, record, tensor, torch
from hf_helpers import transformers as hf_transformers

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
from zoo.interop.architectures import architecture_for
from zoo.interop.weights import write_safetensors
from zoo.nn.multihead import QKNorm
from zoo.nn.plan import LayerOverride
from zoo.nn.rotary import Rope
from zoo.records import get_path

pytestmark = pytest.mark.hf

SMALL = dict(
    vocab_size=61,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
    query_pre_attn_scalar=20,  # not head_dim: the scale is its own setting
    sliding_window=3,  # shorter than the 8-token sequences
)
VARIANTS = {
    # alternating sliding/full layers, both soft-caps, tied head
    "gemma2-softcap": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        dict(num_hidden_layers=3, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    ),
    # two sliding layers to one full one, a local rotary base, QK-norm, untied, biases
    "gemma3-pattern3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=4,
            sliding_window_pattern=3,
            rope_theta=100000.0,
            rope_local_base_freq=100.0,
            tie_word_embeddings=False,
            attention_bias=True,
        ),
    ),
}
TOKENS = np.array([[5, 17, 3, 44, 8, 21, 9, 30], [12, 7, 33, 4, 40, 0, 0, 0]])
REAL = np.array([[1] * 8, [1] * 5 + [0] * 3])


def make_hf(variant: str, seed: int = 0):
    class_name, config_class, fields = VARIANTS[variant]
    config = getattr(hf_transformers, config_class)(**SMALL, **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomize(getattr(hf_transformers, class_name)(config), seed=seed)


def hf_logits(hf, tokens=TOKENS, real=REAL) -> np.ndarray:
    with torch.no_grad():
        return hf(tensor(tokens), attention_mask=tensor(real)).logits.float().numpy()


@eqx.filter_jit
def zoo_logits(model, tokens=TOKENS, real=REAL):
    return jax.vmap(model)(jnp.asarray(tokens), jnp.asarray(real, bool))


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    hf = make_hf(request.param)
    return request.param, hf, hf_logits(hf)


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_logits_match_on_a_padded_batch(run, layer_loop):
    variant, hf, theirs = run
    model = from_hf(hf, layer_loop=layer_loop)
    diff = max_diff(zoo_logits(model), theirs, REAL)
    record(variant, diff)
    assert diff < LOGIT_TOL


def global_layers(config) -> tuple[int, ...]:
    """The layers that attend to every position (Gemma's full layers)."""
    return tuple(i for i, s in enumerate(config.layers.layers()) if s.attention.window is None)


def local_rope_theta(config) -> float | None:
    """The sliding layers' rotary base where it is not the full layers', else None."""
    layers = config.layers.layers()
    local = {s.attention.rope.theta for s in layers if s.attention.window is not None}
    full = {s.attention.rope.theta for s in layers if s.attention.window is None}
    return None if local == full else local.pop()


def test_the_zoo_config_says_what_each_gemma_is(run):
    variant, hf, _ = run
    c = from_hf(hf).config
    shared = {
        "norm.weight_offset": 1.0,
        "output_norm": True,
        "norm_first": True,
        "embedder.scale": True,
        "feed_forward.activation": "gelu_tanh",
        "feed_forward.kind": "gated",
        "attention.scale_dim": 20.0,
        "attention.window": 3,
    }
    expected = {
        "gemma2-softcap": {
            "attention.softcap": 2.0,
            "head.softcap": 3.0,
            "attention.qk_norm": None,
            "head.tie": True,
        },
        "gemma3-pattern3": {
            "attention.softcap": None,
            "head.softcap": None,
            "attention.qk_norm": QKNorm(eps=1e-6, weight_offset=1.0),
            "head.tie": False,
            "attention.qkv_bias": True,
        },
    }[variant]
    wanted = {**shared, **expected}
    assert {path: get_path(c, c.paths(path)[0]) for path in wanted} == wanted
    layers = {"gemma2-softcap": ((1,), None), "gemma3-pattern3": ((2,), 100.0)}[variant]
    assert (global_layers(c), local_rope_theta(c)) == layers
    full_rope = c.layers.layer(global_layers(c)[0]).attention.rope
    assert full_rope.theta == (10000.0 if variant == "gemma2-softcap" else 100000.0)


@pytest.mark.parametrize(
    ("variant", "layer_loop"), [("gemma2-softcap", "unroll"), ("gemma3-pattern3", "scan")]
)
def test_cached_decoding_equals_the_full_forward(variant, layer_loop):
    model = from_hf(make_hf(variant), layer_loop=layer_loop)
    tokens = jnp.asarray(TOKENS[0])
    full = model(tokens)
    logits, cache = eqx.filter_jit(model.prefill)(tokens[:4], 16)
    pieces = [logits]
    extend = eqx.filter_jit(model.extend)
    for index in range(4, 8):  # past the window of 3: the cache must drop the oldest keys
        logits, cache = extend(tokens[index : index + 1], cache)
        pieces.append(logits)
    assert max_diff(jnp.concatenate(pieces), full) < LOGIT_TOL


def test_greedy_generation_with_left_padding_matches_transformers():
    hf = make_hf("gemma2-softcap")
    prompts = [[5, 17, 3, 44, 8, 21], [12, 7, 33]]
    left = np.array([[0] * (6 - len(p)) + p for p in prompts])
    left_real = (left != 0).astype(int)
    with torch.no_grad():
        theirs = hf.generate(
            tensor(left),
            attention_mask=tensor(left_real),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )[:, 6:].numpy()
    ours = zoo.generate(from_hf(hf, eos_id=None), prompts, max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_to_hf_loads_strictly_in_transformers_with_the_same_logits(run):
    _, hf, theirs = run
    state_dict, config = to_hf(from_hf(hf))
    config._attn_implementation = "eager"
    again = getattr(hf_transformers, config.architectures[0])(config).eval()
    again.load_state_dict(state_dict, strict=True)
    assert type(again) is type(hf)
    assert max_diff(hf_logits(again), theirs, REAL) < LOGIT_TOL


def test_save_hf_loads_back_in_transformers(run, tmp_path):
    _, hf, theirs = run
    model = from_hf(hf)
    save_hf(model, tmp_path)
    again = hf_transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again) is type(hf)
    assert max_diff(hf_logits(again), theirs, REAL) < LOGIT_TOL
    assert max_diff(zoo_logits(from_pretrained(tmp_path)), zoo_logits(model), REAL) == 0.0


# gemma-3-1b's config.json as the hub has it, shrunk (the fields a tiny model changes)
GEMMA3_HUB_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": [1, 6],
    "final_logit_softcapping": None,
    "head_dim": 12,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 7,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 12,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 3,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vocab_size": 61,
}


def write_hub_folder(folder, config: dict, state: dict, *, shards: int) -> None:
    """Sharded bf16 safetensors with an index, and the given config.json, as on the hub."""
    (folder / "config.json").write_text(json.dumps(config))
    arrays = {
        name: value.float().numpy().astype(ml_dtypes.bfloat16)
        for name, value in state.items()
        if name != "lm_head.weight"  # tied: the hub files leave it out
    }
    names, weight_map = sorted(arrays), {}
    for number in range(shards):
        filename = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        part = names[number::shards]
        write_safetensors({n: arrays[n] for n in part}, folder / filename)
        weight_map.update(dict.fromkeys(part, filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_sharded_bf16_gemma3_hub_folder_loads_as_transformers_reads_it(tmp_path):
    config = hf_transformers.AutoConfig.for_model(**GEMMA3_HUB_CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    hf = randomize(hf_transformers.Gemma3ForCausalLM(config), seed=1)
    write_hub_folder(tmp_path, GEMMA3_HUB_CONFIG, hf.state_dict(), shards=3)
    model = from_pretrained(tmp_path)
    c = model.config
    assert c.dtype == "bfloat16" and model.embedder.token_weight.dtype == jnp.bfloat16
    full_theta = c.layers.layer(5).attention.rope.theta
    assert (global_layers(c), local_rope_theta(c), full_theta) == ((5,), 10000.0, 1e6)
    assert (c.eos_id, c.stop_ids, c.bos_id, c.pad_id) == (1, (6,), 2, 0)
    reference = hf_transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ours = zoo_logits(from_pretrained(tmp_path, dtype="float32"))
    assert max_diff(ours, hf_logits(reference), REAL) < LOGIT_TOL


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("use_bidirectional_attention", True, "use_bidirectional_attention"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
        ("hidden_activation", "relu2", "hidden_activation"),
        ("layer_types", ["sliding_attention", "chunked_attention"], "layer_types"),
    ],
)
def test_options_that_change_the_computation_are_refused_by_name(field, value, message):
    config = dict(GEMMA3_HUB_CONFIG, num_hidden_layers=2)
    config[field] = value
    with pytest.raises(UnsupportedConfig, match=message):
        load_state_dict(config, {})


PRESETS = {
    "gemma-2-2b": ("Gemma2ForCausalLM", 2_614_341_888),
    "gemma-3-1b": ("Gemma3ForCausalLM", 999_885_952),
    "gemma-3-270m": ("Gemma3ForCausalLM", 268_098_176),
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_counts_equal_transformers(name):
    check_preset_count(name, *PRESETS[name])


def test_the_tiny_gemma3_preset_exports_and_matches_transformers():
    model = zoo.create("gemma-3-tiny", key=jax.random.key(0), remat=None)
    state_dict, config = to_hf(model)
    config._attn_implementation = "eager"
    again = getattr(hf_transformers, config.architectures[0])(config).eval()
    again.load_state_dict(state_dict, strict=True)
    tokens = np.array([[3, 9, 27, 4, 50, 11, 8, 33, 21, 5, 6]])  # past the window of 8
    real = np.ones_like(tokens)
    assert max_diff(zoo_logits(model, tokens, real), hf_logits(again, tokens, real)) < LOGIT_TOL


def test_export_refuses_layers_gemma_cannot_express():
    gemma3 = zoo.presets.config("gemma-3-tiny")
    differs = LayerOverride(changes={"attention.qkv_bias": True}, layers=(0,))
    config = gemma3.replace(**{"layers.overrides": (*gemma3.layers.overrides, differs)})
    with pytest.raises(UnsupportedExport, match="layer 0 differs .* window and rotary base"):
        architecture_for(config).hf_config(config)
    gemma2 = zoo.presets.config("gemma-2-tiny")
    local = LayerOverride(changes={"attention.rope": Rope(theta=100.0)}, start=0, step=2)
    config = gemma2.replace(**{"layers.overrides": (*gemma2.layers.overrides, local)})
    with pytest.raises(UnsupportedExport, match="one rotary base for every layer"):
        architecture_for(config).hf_config(config)


def test_bf16_logits_are_no_further_from_fp32_than_transformers_bf16():
    """Gemma's sqrt(d_model) embedding scale is rounded to bf16 on both sides, its `1 + weight`
    norms are computed in float32 on both sides."""
    hf = make_hf("gemma2-softcap")
    reference = hf_logits(hf).astype(np.float64)
    hf_bf16 = make_hf("gemma2-softcap").to(torch.bfloat16)
    theirs = hf_logits(hf_bf16)
    model = from_hf(hf_bf16)
    assert model.config.dtype == "bfloat16"
    ours = np.asarray(zoo_logits(model).astype(jnp.float32))
    real = REAL.astype(bool)

    def rms(logits):
        return float(np.sqrt(np.mean((logits[real] - reference[real]) ** 2)))

    print(f"\n[bf16] gemma2: zoo rms error {rms(ours):.3g}, transformers {rms(theirs):.3g}")
    assert rms(ours) <= 1.5 * rms(theirs)
