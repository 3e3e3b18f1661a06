"""Expert adapters in PEFT's per-expert format load in `peft` on the exported transformers 5
model (which fuses its experts; peft maps the per-expert adapters onto them) with zoo's logits."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.interop.hf_helpers import randomize, torch, transformers
from zoo.nn.lora import LoRAExperts, LoRALinear

peft = pytest.importorskip("peft", reason="the PEFT tests need peft: pip install -e .[hf]")
pytestmark = [pytest.mark.hf, pytest.mark.slow]

TOKENS = np.array([[5, 9, 13, 7, 22, 40, 3, 11], [1, 30, 31, 32, 17, 4, 9, 50]])
SMALL = dict(
    vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    num_experts_per_tok=2, bos_token_id=1, eos_token_id=2, pad_token_id=None,
)  # fmt: skip
FAMILIES = {  # (class, config, fields, the experts' HF leaf names)
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4), ["w1", "w2", "w3"]),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(num_experts=4, moe_intermediate_size=24, head_dim=12, norm_topk_prob=True),
        ["down_proj", "gate_proj", "up_proj"],
    ),
    # a dense layer between two sparse ones: the sparse group's rows are layers 0 and 2
    "qwen3_moe_mixed": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(
            num_experts=4, moe_intermediate_size=24, head_dim=12, norm_topk_prob=True,
            num_hidden_layers=3, mlp_only_layers=[1],
        ),
        ["down_proj", "gate_proj", "up_proj"],
    ),
}  # fmt: skip


def make_hf(family: str):
    class_name, config_name, fields, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SMALL, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(getattr(transformers, class_name)(config), std=0.3)


def randomize_all(model):
    def fill(node):
        if not isinstance(node, LoRAExperts | LoRALinear):
            return node
        noise = 0.3 * jax.random.normal(jax.random.key(node.lora_b.size), node.lora_b.shape)
        return type(node)(node.base, node.lora_a, noise, alpha=node.alpha)

    is_adapter = lambda n: isinstance(n, LoRAExperts | LoRALinear)  # noqa: E731
    return jax.tree_util.tree_map(fill, model, is_leaf=is_adapter)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_expert_adapters_load_in_peft_with_the_same_logits(family, tmp_path):
    hf = make_hf(family)
    model = zoo.from_hf(hf)
    adapted = zoo.lora.apply(
        model, rank=2, alpha=4, targets="experts,attention.qv", key=jax.random.key(1)
    )
    adapted = randomize_all(adapted)
    zoo.lora.save_adapter(adapted, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert set(FAMILIES[family][3]) <= set(config["target_modules"])
    ours = np.asarray(jax.vmap(adapted)(jnp.asarray(TOKENS)))
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(hf, tmp_path)(torch.tensor(TOKENS)).logits.numpy()
    base = np.asarray(jax.vmap(model)(jnp.asarray(TOKENS)))
    assert np.abs(ours - theirs).max() <= 1e-5
    assert np.abs(ours - base).max() > 1e-2  # the adapters do something
