"""`target_modules` as PEFT writes them: short names where they choose exactly the adapted
modules, one regex where a layer index tells them apart; checked by PEFT's own matching."""

from __future__ import annotations

import pytest

from zoo.lora.peft_targets import peft_targets

peft_utils = pytest.importorskip("peft.tuners.tuners_utils", reason="needs peft (.[hf])")
LoraConfig = pytest.importorskip("peft").LoraConfig

GPT2 = [f"transformer.h.{layer}.{name}" for layer in range(3)
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]  # fmt: skip
BERT = [f"bert.encoder.layer.{layer}.{name}" for layer in range(2)
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "intermediate.dense", "output.dense")]  # fmt: skip
LLAMA = [f"model.layers.{layer}.{name}" for layer in range(12)
         for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]  # fmt: skip


def chosen_by_peft(targets: list[str] | str, modules: list[str]) -> list[str]:
    config = LoraConfig(target_modules=targets)
    return [m for m in modules if peft_utils.check_target_module_exists(config, m)]


@pytest.mark.parametrize(
    ("modules", "adapted", "expected"),
    [
        (LLAMA, ("q_proj", "v_proj"), ["q_proj", "v_proj"]),
        (
            LLAMA,
            ("proj",),
            ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
        ),
        (GPT2, ("attn.",), ["attn.c_proj", "c_attn"]),  # c_proj alone would take mlp.c_proj
        (GPT2, ("c_",), ["c_attn", "c_fc", "c_proj"]),
        (
            BERT,
            ("query", "value", "intermediate.dense", "layer.0.output", "layer.1.output"),
            r"(?:bert\.encoder\.layer\.\d+\.attention\.self\.query|"
            r"bert\.encoder\.layer\.\d+\.attention\.self\.value|"
            r"bert\.encoder\.layer\.\d+\.intermediate\.dense|"
            r"bert\.encoder\.layer\.\d+\.output\.dense)",
        ),
        (GPT2, (".0.attn.c_attn", ".2.attn.c_attn"), r"transformer\.h\.(?:0|2)\.attn\.c_attn"),
    ],
)
def test_targets_choose_exactly_the_adapted_modules(modules, adapted, expected):
    chosen = [m for m in modules if any(part in m for part in adapted)]
    targets = peft_targets(chosen, modules)
    assert targets == expected
    assert chosen_by_peft(targets, modules) == chosen
