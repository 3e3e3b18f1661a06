"""PEFT format both ways: zoo adapters load in `peft` on the exported transformers model, and PEFT
adapters made with `peft` load onto zoo models, with the same logits."""

from __future__ import annotations

import json

import equinox as eqx
import numpy as np
import pytest
from safetensors.numpy import load_file

import zoo
from tests.interop.hf_helpers import randomize, torch, transformers
from tests.lora.helpers import forward, randomize_adapters

peft = pytest.importorskip("peft", reason="the PEFT tests need peft: pip install -e .[hf]")
pytestmark = [pytest.mark.hf, pytest.mark.slow]

TOKENS = np.array([[5, 17, 3, 44, 8, 21], [12, 7, 33, 4, 40, 9]])
TOL = 1e-5


def make_hf(name: str):
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16, bos_token_id=0,
            eos_token_id=0,
        )  # fmt: skip
        return randomize(transformers.GPT2LMHeadModel(config))
    if name == "bert":
        config = transformers.BertConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=16, num_labels=3,
        )  # fmt: skip
        return randomize(transformers.BertForSequenceClassification(config))
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    config._attn_implementation = "eager"
    return randomize(transformers.LlamaForCausalLM(config))


def hf_logits(hf) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(TOKENS)).logits.numpy()


CASES = {  # architecture -> zoo targets, arrays trained whole
    "gpt2": ("all-linear", ()),  # the fused c_attn, c_proj and the MLP
    "bert": ("attention.qv,feedforward", ("head",)),
    "llama": ("attention,feedforward", ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_zoo_adapter_loads_in_peft_with_the_same_logits(name, key, tmp_path):
    hf = make_hf(name)
    model = zoo.from_hf(hf)
    targets, train = CASES[name]
    adapted = randomize_adapters(zoo.lora.apply(model, rank=4, alpha=8, targets=targets, key=key))
    if train:  # a head trained whole changes too, and travels as PEFT's modules_to_save
        adapted = eqx.tree_at(lambda m: m.head.weight, adapted, 1.5 * adapted.head.weight)
    zoo.lora.save_adapter(adapted, tmp_path, train=train, base_model=f"tiny-{name}")
    ours = np.asarray(forward(adapted, TOKENS))
    loaded = peft.PeftModel.from_pretrained(hf, tmp_path)
    theirs = hf_logits(loaded)
    assert np.abs(ours - theirs).max() <= TOL
    assert np.abs(ours - hf_logits(make_hf(name))).max() > 1e-3  # the adapter does something
    # the targets choose exactly the modules whose adapters the folder holds
    weights = load_file(tmp_path / "adapter_model.safetensors")
    saved = {key.split(".lora_A.")[0] for key in weights if ".lora_A." in key}
    adapted = {name for name, module in loaded.named_modules() if hasattr(module, "lora_A")}
    assert adapted == saved
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    if name == "gpt2":  # q, k, v adapters of rank 4 become one of rank 12 on c_attn
        assert config["target_modules"] == ["c_attn", "c_fc", "c_proj"]  # short, as PEFT's
        assert config["rank_pattern"]["transformer\\.h\\.0\\.attn\\.c_attn"] == 12
        assert config["fan_in_fan_out"] is True
    if name == "bert":
        assert config["modules_to_save"] == ["classifier"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_peft_adapter_loads_onto_zoo_with_the_same_logits(name, tmp_path):
    hf = make_hf(name)
    model = zoo.from_hf(hf)
    targets = {
        "gpt2": ["c_attn", "c_fc"],
        "bert": ["query", "value"],
        "llama": ["q_proj", "down_proj"],
    }
    config = peft.LoraConfig(
        r=3, lora_alpha=5, target_modules=targets[name], init_lora_weights=False,
        fan_in_fan_out=name == "gpt2", layers_to_transform=None,
    )  # fmt: skip
    adapted_hf = peft.get_peft_model(hf, config)
    adapted_hf.save_pretrained(tmp_path)
    theirs = hf_logits(adapted_hf)
    loaded = zoo.lora.load_adapter(model, tmp_path)
    assert np.abs(np.asarray(forward(loaded, TOKENS)) - theirs).max() <= TOL
    np.testing.assert_allclose(forward(zoo.lora.merge(loaded), TOKENS), theirs, atol=TOL, rtol=TOL)


def test_an_adapter_for_another_base_names_the_mismatch(key, tmp_path):
    small = zoo.from_hf(make_hf("gpt2"))
    zoo.lora.save_adapter(
        randomize_adapters(zoo.lora.apply(small, rank=2, key=key)), tmp_path, base_model="tiny"
    )
    wider = zoo.create("gpt-tiny", key=key, vocab_size=50, d_model=48, num_heads=4, num_layers=2)
    with pytest.raises(
        ValueError, match=r"c_attn has lora_A \[6, 32\].* 144 x 48.* base_model_name_or_path='tiny'"
    ):
        zoo.lora.load_adapter(wider, tmp_path)
    llama = zoo.from_hf(make_hf("llama"))
    with pytest.raises(
        ValueError, match="adapts 'transformer.h.0.attn.c_attn', which this llama model lacks"
    ):
        zoo.lora.load_adapter(llama, tmp_path)
    with pytest.raises(FileNotFoundError, match="no adapter_config.json in"):
        zoo.lora.load_adapter(small, tmp_path / "nothing")
