"""T5 v1.0 and v1.1 (FLAN-T5) <-> zoo.Translator parity with transformers.

Tiny random models saved with `save_pretrained`: logits on padded batches, cached decoding,
greedy translation against `generate`, beam search, export both ways, preset parameter counts,
refused variants, and the SentencePiece tokenizer read from `tokenizer.json`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, jnp_int, max_diff, record, tensor, torch, transformers

import zoo
from zoo.decoding.beam import length_penalty
from zoo.decoding.translate import beam_translate
from zoo.interop import UnsupportedConfig, from_pretrained, load_state_dict, save_hf, to_hf
from zoo.nn import RelativePositions

pytestmark = pytest.mark.hf

# v1.0: dense relu, tied head rescaled by d_model^-0.5. v1.1 / FLAN: gated GELU, untied head;
# here also more decoder than encoder layers and heads x d_kv != d_model. Few buckets and a
# short max_distance make these sequences reach the logarithmic and the clipped buckets.
VARIANTS = {
    "v1.0": dict(feed_forward_proj="relu", num_layers=2, d_kv=8, num_heads=4),
    "v1.1": dict(
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        num_layers=1,
        num_decoder_layers=3,
        d_kv=6,
        num_heads=3,
    ),
}
SOURCE = np.array(
    [[*range(3, 21), 1], [9, 10, 11, 12, 1] + [0] * 14]  # 1 is eos, 0 is pad
)
TARGET = np.array([[0, *range(5, 20)], [0, *range(20, 35)]])  # decoding starts from pad


def make_hf(variant: str, seed: int = 0, std: float = 0.3):
    config = transformers.T5Config(
        vocab_size=50,
        d_model=16,
        d_ff=24,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
        decoder_start_token_id=0,
        **VARIANTS[variant],
    )
    torch.manual_seed(seed)
    hf = transformers.T5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if not config.scale_decoder_outputs:  # v1.1: an lm_head of its own
            hf.lm_head.weight = torch.nn.Parameter(torch.empty(50, 16))
        for name, param in hf.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if "layer_norm" in name else std * noise)
    return hf.eval()


def hf_logits(hf, source=SOURCE, target=TARGET):
    with torch.no_grad():
        return hf(
            input_ids=tensor(source),
            attention_mask=tensor((source != 0).astype(int)),
            decoder_input_ids=tensor(target),
        ).logits.numpy()


@eqx.filter_jit
def zoo_logits(model, src, tgt):
    return jax.vmap(model)(src, tgt)


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request, tmp_path_factory):
    hf = make_hf(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, from_pretrained(folder), folder


def test_logits_match_with_a_padded_source(run):
    name, hf, model, _ = run
    ours = zoo_logits(model, jnp_int(SOURCE), jnp_int(TARGET))
    diff = max_diff(ours, hf_logits(hf))
    record("t5", diff)
    assert diff <= LOGIT_TOL, f"{name}: {diff}"
    c = model.config
    for block in (c.layers.block, c.decoder.block):
        assert (block.attention.scale_dim, block.norm.kind) == (1.0, "rmsnorm")
    assert c.decoder.block.cross_attention.scale_dim == 1.0  # unscaled scores
    assert (c.embedder.positions, c.relative, c.bos_id, c.pad_id) == (
        "none",
        RelativePositions(num_buckets=8, max_distance=12),
        0,
        0,
    )
    assert (c.head.tie, c.head.scale) == ((True, True) if name == "v1.0" else (False, False))


def test_cached_decoding_equals_the_full_decoder(run):
    _, hf, model, _ = run
    src = jnp_int(SOURCE[1])
    state = model.start_decoding(src, 16)
    step = eqx.filter_jit(lambda model, token, state: model.decode_step(token, state))
    steps = []
    for token in TARGET[1]:
        logits, state = step(model, jnp.array([token], jnp.int32), state)
        steps.append(logits[0])
    full = model(src, jnp_int(TARGET[1]))
    assert max_diff(jnp.stack(steps), full) <= 1e-5
    assert max_diff(full, hf_logits(hf)[1]) <= LOGIT_TOL


@pytest.mark.slow
def test_twenty_greedy_tokens_equal_generate(run):
    _, _, _, folder = run
    hf = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    hf.generation_config.eos_token_id = None  # 20 tokens each
    with torch.no_grad():
        expected = hf.generate(
            tensor(SOURCE),
            attention_mask=tensor((SOURCE != 0).astype(int)),
            max_new_tokens=20,
            do_sample=False,
            num_beams=1,
            # transformers' cache sizes itself by num_layers, failing when the decoder has more
            use_cache=False,
        )[:, 1:].numpy()
    # zoo stops at eos: give its model an eos that these 20 tokens never reach
    unused = min(set(range(2, 50)) - set(expected.ravel().tolist()))
    model = from_pretrained(folder, eos_id=unused)
    ours = np.asarray(zoo.translate(model, SOURCE, max_len=20))
    assert expected.shape == ours.shape == (2, 20)
    np.testing.assert_array_equal(ours, expected)
    assert len(set(ours.ravel().tolist())) > 5  # real sequences, not one token repeated


@pytest.mark.slow
def test_beam_search_keeps_true_scores(run):
    _, _, model, _ = run
    tokens, scores = beam_translate(model, SOURCE, max_len=8, beam_size=4, length_penalty=0.6)
    for row in range(2):
        tgt = jnp.concatenate([jnp.zeros(1, jnp.int32), tokens[row]])
        log_probs = jax.nn.log_softmax(model(jnp_int(SOURCE[row]), tgt)[:-1], axis=-1)
        ids = np.asarray(tokens[row])
        length = int(np.argmax(ids == 1)) + 1 if 1 in ids else len(ids)
        total = sum(float(log_probs[t, ids[t]]) for t in range(length))
        expected = total / float(length_penalty(length, 0.6))
        np.testing.assert_allclose(float(scores[row]), expected, atol=1e-4)
    assert np.asarray(zoo.translate(model, SOURCE, max_len=8, beam_size=4)).shape == (2, 8)


def test_to_hf_and_save_hf_load_in_transformers(run, tmp_path):
    name, hf, model, _ = run
    state_dict, config = to_hf(model)
    assert set(hf.state_dict()) <= set(state_dict)
    exported = transformers.T5ForConditionalGeneration(config).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(exported), hf_logits(hf)) <= 1e-6, name
    save_hf(model, tmp_path)
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(reloaded), hf_logits(hf)) <= 1e-6, name
    assert from_pretrained(tmp_path).config == model.config


@pytest.mark.parametrize("name", ["t5-small", "flan-t5-small", "flan-t5-base"])
def test_preset_parameter_counts_equal_transformers(name):
    c = zoo.presets.config(name)
    config = transformers.T5Config(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        d_kv=c.head_dim,
        d_ff=c.layers.block.feed_forward.d_ff,
        num_layers=c.num_layers,
        num_heads=c.num_heads,
        feed_forward_proj="relu" if c.layers.block.feed_forward.kind == "dense" else "gated-gelu",
        tie_word_embeddings=c.head.tie,
    )
    with torch.device("meta"):
        hf = transformers.T5ForConditionalGeneration(config)
        if not c.head.tie:  # FLAN-T5's own lm_head (transformers 5 ties it until loading)
            hf.lm_head.weight = torch.nn.Parameter(torch.empty(c.vocab_size, c.d_model))
    expected = sum(p.numel() for p in hf.parameters())
    assert zoo.presets.param_count(name) == expected
    assert expected == {"t5-small": 60506624, "flan-t5-small": 76961152}.get(name, 247577856)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(model_type="umt5"), "model_type='umt5' is not supported: UMT5 gives every layer"),
        (dict(feed_forward_proj="gated-tanh"), "feed_forward_proj='gated-tanh'"),
        (dict(feed_forward_proj="dense-relu-x"), "feed_forward_proj='dense-relu-x'"),
        (dict(is_decoder=True), "is_decoder=True"),
    ],
)
def test_unsupported_variants_are_refused_by_name(fields, message):
    with pytest.raises(UnsupportedConfig, match=message):
        load_state_dict({"model_type": "t5", **fields}, {})


def test_a_gated_exact_gelu_is_not_exported():
    parts = {
        "attention.head_dim": 4, "cross_attention.head_dim": 4, "feed_forward.kind": "gated",
        "feed_forward.activation": "gelu",
    }  # fmt: skip
    model = zoo.create(
        "t5-small", vocab_size=40, d_model=8, num_heads=2, d_ff=8, num_layers=1,
        key=jax.random.key(0), **parts,
    )  # fmt: skip
    with pytest.raises(ValueError, match="use activation='gelu_tanh'"):
        to_hf(model)
