"""The FLOP count against counts done by hand."""

from __future__ import annotations

import pytest

from zoo import presets
from zoo.bench.flops import (
    decoder_flops_per_token,
    flop_params,
    source_target_params,
    train_flops,
)

# gpt-tiny: vocab 64, d_model 64, 4 heads of 16, 2 layers, d_ff 256, 128 learned positions, tied.
TOKEN_TABLE = 64 * 64  # 4096
ATTENTION = 4 * (64 * 64 + 64)  # q, k, v, out projections with biases: 16640
NORM = 2 * 64  # scale and offset: 128
GPT_FF = 64 * 256 + 256 + 256 * 64 + 64  # 33088
GPT_LAYER = ATTENTION + GPT_FF + 2 * NORM  # 49984
GPT_N = TOKEN_TABLE + 2 * GPT_LAYER + NORM  # 104192; the 128 x 64 position table is left out


def test_gpt_tiny_by_hand():
    model = presets.abstract("gpt-tiny")
    assert flop_params(model) == GPT_N == 104192
    assert presets.count_params(model) == GPT_N + 128 * 64
    # 6N + 12 L H Q T at T = 32: 6 * 104192 + 12 * 2 * 4 * 16 * 32 = 625152 + 49152
    assert decoder_flops_per_token(GPT_N, 2, 4, 16, 32) == 674304
    count = train_flops(model, batch=2, seq=32)
    assert count.tokens_per_step == 2 * 32
    assert count.flops_per_step == 2 * 32 * 674304
    assert count.flops_per_token == 674304


def test_classifier_tiny_by_hand():
    # d_ff 128, a 2-class head on the pooled vector, no pooler, no token types.
    feed_forward = 64 * 128 + 128 + 128 * 64 + 64  # 16576
    layer = ATTENTION + feed_forward + 2 * NORM  # 33472
    n = TOKEN_TABLE + 2 * layer + NORM + (64 * 2 + 2)  # 71298
    model = presets.abstract("classifier-tiny")
    assert flop_params(model) == n == 71298
    # T = 64: 6 * 71298 + 12 * 2 * 4 * 16 * 64 = 427788 + 98304
    assert train_flops(model, batch=1, seq=64).flops_per_step == 64 * 526092


def test_translator_tiny_by_hand():
    # translator-tiny: 2 + 2 layers, d_ff 256, sinusoidal positions (no table), one shared
    # token table that is also the output projection, pre-LN with a final norm per stack.
    encoder = 2 * GPT_LAYER + NORM  # 100096
    cross_key_value = 2 * 2 * (64 * 64 + 64)  # per decoder layer k and v: 16640
    source = encoder + cross_key_value  # 116736
    decoder_layer = ATTENTION + 2 * (64 * 64 + 64) + GPT_FF + 3 * NORM  # 58432
    target = 2 * decoder_layer + NORM + TOKEN_TABLE  # 121088
    model = presets.abstract("translator-tiny")
    assert source_target_params(model) == (source, target) == (116736, 121088)
    assert presets.count_params(model) == source + target
    # S = T = 10, per pair: 6 (N_src S + N_tgt T) + 12 H Q (L_enc S^2 + L_dec T^2 + L_dec T S)
    #   = 6 * 237824 * 10 + 12 * 64 * (200 + 200 + 200) = 14269440 + 460800
    count = train_flops(model, batch=3, seq=10)
    assert count.flops_per_step == 3 * 14730240
    assert count.tokens_per_step == 3 * 20
    assert count.params == 237824


def test_gpt2_matches_the_published_count():
    model = presets.abstract("gpt2")
    # GPT-2 small has 124,439,808 parameters, 1024 x 768 of them in the position table.
    assert presets.count_params(model) == 124_439_808
    n = 124_439_808 - 1024 * 768
    count = train_flops(model, batch=16, seq=1024)
    assert count.flops_per_token == 6 * n + 12 * 12 * 12 * 64 * 1024 == 855_166_464


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="batch and seq must be positive"):
        train_flops(presets.abstract("gpt-tiny"), batch=0, seq=8)
