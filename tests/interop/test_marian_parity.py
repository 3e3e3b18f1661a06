"""MarianMT <-> zoo.Translator parity with transformers: logits, parts, generation, export."""

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

from zoo.interop import (
    CheckpointMismatch,
    UnsupportedConfig,
    from_hf,
    from_pretrained,
    load_state_dict,
    save_hf,
    to_hf,
)
from zoo.nn import BlockInputs, CrossInputs, Mask

pytestmark = pytest.mark.hf

PAD = 40  # pad id and decoder start, in both vocabularies
VARIANTS = {
    "shared-tied-swish-scaled": dict(
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        activation_function="swish",
        scale_embedding=True,
    ),
    "separate-vocab-odd": dict(
        d_model=30,
        encoder_attention_heads=5,
        decoder_attention_heads=5,
        encoder_layers=1,
        decoder_layers=3,
        decoder_vocab_size=41,
        share_encoder_decoder_embeddings=False,
        activation_function="gelu",
    ),
    "shared-untied": dict(
        d_model=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        tie_word_embeddings=False,
        scale_embedding=True,
    ),
}
SOURCE = np.array([[3, 4, 5, 6, 7, 0], [9, 10, 11, 0, PAD, PAD]])  # 0 is eos
SOURCE_REAL = SOURCE != PAD
TARGET = np.array([[PAD, 5, 6, 7, 8], [PAD, 8, 9, 10, 11]])


def make_hf(variant: str, seed: int = 0, cls=None, std: float = 0.15):
    fields = dict(
        vocab_size=47,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=32,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=0,
    )
    config = transformers.MarianConfig(**{**fields, **VARIANTS[variant]})
    torch.manual_seed(seed)
    # std 0.15: scaled embeddings (x sqrt(d_model)) keep activations near 1, where float32
    # rounding stays well under the tolerances
    hf = randomize((cls or transformers.MarianMTModel)(config), seed=seed, std=std)
    base = getattr(hf, "model", hf)
    if config.share_encoder_decoder_embeddings and not config.tie_word_embeddings:
        # transformers 5 unties these from `shared` along with the output; a checkpoint saved
        # by transformers 4 holds one table, which is what zoo (and Marian) mean by sharing.
        with torch.no_grad():
            base.encoder.embed_tokens.weight.copy_(base.shared.weight)
            base.decoder.embed_tokens.weight.copy_(base.shared.weight)
    return hf


def hf_logits(hf):
    with torch.no_grad():
        return hf(
            input_ids=tensor(SOURCE),
            attention_mask=tensor(SOURCE_REAL.astype(int)),
            decoder_input_ids=tensor(TARGET),
        ).logits.numpy()


@eqx.filter_jit
def zoo_outputs(model, src, real, tgt):
    """Logits, source embeddings, encoder attention and block 0, decoder block 0, batched."""
    encoder_block, decoder_block = model.encoder.layer(0), model.decoder.layer(0)

    def one(src, real, tgt):
        x = model.source_embedder(src, jnp.arange(src.shape[0]))
        mask = Mask.keys(real, src.shape[0])
        attended = encoder_block.self_attention(x, mask=mask)
        encoded = encoder_block(x, BlockInputs(mask=mask))[0]
        memory = model.encode(src, real)
        y = model.target_embedder(
            tgt, jnp.arange(tgt.shape[0]), token_weight=model.target_token_weight
        )
        cross = CrossInputs(
            *decoder_block.cross_attention.project_key_value(memory),
            Mask.keys(real, tgt.shape[0]),
        )
        decoded = decoder_block(y, BlockInputs(mask=Mask(causal=True), cross=cross))[0]
        return model(src, tgt, real), x, attended, encoded, decoded

    return jax.vmap(one)(src, real, tgt)


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request):
    hf = make_hf(request.param)
    model = from_hf(hf)
    outputs = [
        capture(hf.model.encoder.layers[0].self_attn),
        capture(hf.model.encoder.layers[0]),
        capture(hf.model.decoder.layers[0]),
    ]
    with torch.no_grad():
        states = hf(
            input_ids=tensor(SOURCE),
            attention_mask=tensor(SOURCE_REAL.astype(int)),
            decoder_input_ids=tensor(TARGET),
            output_hidden_states=True,
        )
    theirs = (states.logits, states.encoder_hidden_states[0], *(out[0] for out in outputs))
    ours = zoo_outputs(model, jnp_int(SOURCE), jnp.asarray(SOURCE_REAL), jnp_int(TARGET))
    return request.param, hf, model, theirs, ours


def test_logits_match_with_a_padded_source(run):
    name, hf, model, theirs, ours = run
    diff = max_diff(ours[0], theirs[0])
    record("marian", diff)
    assert diff <= LOGIT_TOL, f"{name}: {diff}"
    assert model.config.bos_id == hf.config.decoder_start_token_id == PAD
    assert model.config.share_embeddings == hf.config.share_encoder_decoder_embeddings


@pytest.mark.parametrize(
    ("part", "real"),
    [(1, SOURCE_REAL), (2, SOURCE_REAL), (3, SOURCE_REAL), (4, None)],
    ids=["embeddings", "encoder-attention", "encoder-block", "decoder-block"],
)
def test_embeddings_attention_and_blocks_match(run, part, real):
    name, _, _, theirs, ours = run
    assert max_diff(ours[part], theirs[part], real) <= PART_TOL, name


@eqx.filter_jit
def greedy(model, src, real, steps: int):
    """`steps` greedy tokens per source with the incremental decoder, batched."""

    def one(src, real):
        state = model.start_decoding(src, steps, real)

        def step(carry, _):
            token, state = carry
            logits, state = model.decode_step(token, state)
            chosen = jnp.argmax(logits[-1]).astype(jnp.int32)
            return (chosen[None], state), chosen

        start = jnp.full((1,), model.config.bos_id, jnp.int32)
        return jax.lax.scan(step, (start, state), None, length=steps)[1]

    return jax.vmap(one)(src, real)


def test_greedy_translation_matches_transformers_generate():
    hf = make_hf("shared-tied-swish-scaled", seed=4, std=1.0)  # varied, not one token repeated
    hf.generation_config.forced_eos_token_id = None  # would force eos as the 20th token
    model = from_hf(hf)
    with torch.no_grad():
        expected = hf.generate(
            tensor(SOURCE),
            attention_mask=tensor(SOURCE_REAL.astype(int)),
            max_new_tokens=20,
            do_sample=False,
            num_beams=1,
        )[:, 1:].numpy()
    ours = np.asarray(greedy(model, jnp_int(SOURCE), jnp.asarray(SOURCE_REAL), 20))
    assert expected.shape == (2, 20)
    np.testing.assert_array_equal(ours, expected)
    assert len(set(ours[0].tolist())) > 3  # a real sequence, not one token repeated


def test_to_hf_and_save_hf_load_in_transformers(run, tmp_path):
    name, hf, model, _, _ = run
    state_dict, config = to_hf(model)
    assert set(state_dict) == set(hf.state_dict())
    exported = transformers.MarianMTModel(config).eval()
    exported.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(exported), hf_logits(hf)) <= 1e-6, name
    save_hf(model, tmp_path)
    reloaded = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    assert max_diff(hf_logits(reloaded), hf_logits(hf)) <= 1e-6, name
    again = from_pretrained(tmp_path)
    assert again.config == model.config


def test_bare_marian_model_loads_with_a_zero_logits_bias():
    hf = make_hf("shared-tied-swish-scaled", cls=transformers.MarianModel)
    model = from_hf(hf)
    assert np.array_equal(model.output_bias, np.zeros(47, np.float32))
    assert np.array_equal(model.source_embedder.token_weight, hf.shared.weight.detach().numpy())


def test_tied_tables_that_differ_are_refused():
    hf = make_hf("shared-untied")
    with torch.no_grad():
        hf.model.decoder.embed_tokens.weight.add_(1.0)
    with pytest.raises(CheckpointMismatch, match=r"model\.decoder\.embed_tokens\.weight"):
        from_hf(hf)


def test_position_tables_zoo_does_not_compute_are_refused():
    hf = make_hf("shared-untied")
    arrays = {k: v.numpy().copy() for k, v in hf.state_dict().items()}
    arrays["model.encoder.embed_positions.weight"][3] += 0.5
    with pytest.raises(CheckpointMismatch, match=r"model\.encoder\.embed_positions\.weight"):
        load_state_dict(hf.config.to_dict(), arrays)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("normalize_before", True),
        ("normalize_embedding", True),
        ("add_final_layer_norm", True),
        ("static_position_embeddings", False),
        ("add_bias_logits", True),
        ("encoder_layerdrop", 0.1),
        ("decoder_attention_heads", 4),
        ("decoder_ffn_dim", 64),
        ("activation_function", "tanh"),
    ],
)
def test_options_that_change_the_computation_are_refused(option, value):
    config = {
        "model_type": "marian",
        "d_model": 32,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        option: value,
    }
    with pytest.raises(UnsupportedConfig, match=option):
        load_state_dict(config, {})
