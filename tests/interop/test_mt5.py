"""mT5 (`MT5ForConditionalGeneration`) -> zoo.Translator: hub-style folders and the preset.

mT5 is T5 v1.1 with its own model type: an untied head that is never rescaled. Hub configs say
`tie_word_embeddings: false`; transformers 5 writes true and still loads the stored head. Both
folders must give transformers' logits.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from hf_helpers import LOGIT_TOL, jnp_int, max_diff, torch, transformers
from test_t5_parity import hf_logits as t5_logits

import zoo
from zoo.interop import from_pretrained, to_hf

pytestmark = pytest.mark.hf

SOURCE = np.array([[*range(3, 15), 1], [7, 8, 9, 1] + [0] * 9])
TARGET = np.array([[0, *range(5, 16)], [0, *range(16, 27)]])


def make_mt5(seed: int = 0):
    config = transformers.MT5Config(
        vocab_size=60, d_model=16, d_ff=24, num_layers=1, num_decoder_layers=2, num_heads=2,
        d_kv=8, relative_attention_num_buckets=8, relative_attention_max_distance=12,
    )  # fmt: skip
    torch.manual_seed(seed)
    hf = transformers.MT5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(torch.empty(60, 16))  # its own head, as mT5's
        for name, param in hf.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if "layer_norm" in name else 0.3 * noise)
    return hf.eval()


def hf_logits(hf):
    return t5_logits(hf, SOURCE, TARGET)


@pytest.mark.parametrize("tie_in_config", [False, True], ids=["hub-config", "transformers5"])
def test_an_mt5_folder_gives_the_logits_of_transformers(tmp_path, tie_in_config):
    hf = make_mt5()
    hf.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    assert config["model_type"] == "mt5"
    config["tie_word_embeddings"] = tie_in_config
    config_file.write_text(json.dumps(config))
    model = from_pretrained(tmp_path)
    ours = np.asarray(jax.vmap(model)(jnp_int(SOURCE), jnp_int(TARGET)))
    assert max_diff(ours, hf_logits(hf)) <= LOGIT_TOL
    c = model.config
    assert (c.head.tie, c.head.scale) == (False, False)
    assert c.layers.block.feed_forward.kind == "gated" and c.decoder.num_layers == 2
    # exported as T5: the same network, no rescale, the head kept
    state_dict, exported_config = to_hf(model)
    assert exported_config.model_type == "t5" and not exported_config.scale_decoder_outputs
    t5 = transformers.T5ForConditionalGeneration(exported_config).eval()
    t5.load_state_dict(state_dict, strict=True)
    assert max_diff(hf_logits(t5), hf_logits(hf)) <= 1e-6


def test_mt5_small_preset_has_the_parameter_count_of_google_mt5_small():
    c = zoo.presets.config("mt5-small")
    with torch.device("meta"):
        hf = transformers.MT5ForConditionalGeneration(transformers.MT5Config())
        hf.lm_head.weight = torch.nn.Parameter(torch.empty(c.vocab_size, c.d_model))
    expected = sum(p.numel() for p in hf.parameters())
    assert zoo.presets.param_count("mt5-small") == expected == 300176768
