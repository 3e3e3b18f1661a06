"""LoRA dropout: PEFT's `lora_dropout` on the adapter's input, in training only, given a key."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.lora.helpers import randomize_adapters
from zoo.cli._lora import LoRASpec, parse_lora
from zoo.nn.linear import Linear
from zoo.nn.lora import LoRALinear, describe, rebuild

RATE = 0.3


def adapted_linear(dropout_key=None):
    key_w, key_a, key_b, key_x = jax.random.split(jax.random.key(0), 4)
    base = Linear(6, 5, use_bias=True, key=key_w)
    lora_a = jax.random.normal(key_a, (2, 6))
    lora_b = jax.random.normal(key_b, (5, 2))
    layer = LoRALinear(base, lora_a, lora_b, alpha=4.0, dropout=RATE, dropout_key=dropout_key)
    return layer, jax.random.normal(key_x, (7, 6))


def test_lora_dropout_equals_peft_given_the_same_mask():
    """PEFT's `Linear.forward` in training, its dropout replaced by the mask zoo draws from the
    key: `base(x) + B A (x * mask / (1 - p)) * alpha / r`."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")

    key = jax.random.key(7)
    layer, x = adapted_linear(dropout_key=key)
    keep = np.asarray(jax.random.bernoulli(key, 1.0 - RATE, x.shape), np.float32)
    assert 0 < keep.mean() < 1

    class SameMask(torch.nn.Module):
        def forward(self, inputs):
            return inputs * torch.from_numpy(keep) / (1.0 - RATE)

    torch_base = torch.nn.Linear(6, 5)
    with torch.no_grad():
        torch_base.weight.copy_(torch.tensor(np.asarray(layer.base.weight)))
        torch_base.bias.copy_(torch.tensor(np.asarray(layer.base.bias)))
    config = peft.LoraConfig(target_modules=["0"], r=2, lora_alpha=4, lora_dropout=RATE)
    theirs = peft.get_peft_model(torch.nn.Sequential(torch_base), config).base_model.model[0]
    with torch.no_grad():
        theirs.lora_A["default"].weight.copy_(torch.tensor(np.asarray(layer.lora_a)))
        theirs.lora_B["default"].weight.copy_(torch.tensor(np.asarray(layer.lora_b)))
    assert isinstance(theirs.lora_dropout["default"], torch.nn.Dropout)
    theirs.lora_dropout["default"] = SameMask()
    theirs.train()
    expected = theirs(torch.tensor(np.asarray(x))).detach().numpy()
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-5)
    # no dropout without a key, nor in inference mode: PEFT in eval mode
    theirs.lora_dropout["default"] = torch.nn.Dropout(RATE)
    theirs.eval()
    plain = theirs(torch.tensor(np.asarray(x))).detach().numpy()
    for quiet in (adapted_linear()[0], eqx.nn.inference_mode(layer)):
        np.testing.assert_allclose(np.asarray(quiet(x)), plain, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected, plain, atol=1e-3)


def adapted_gpt(dropout):
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    model = zoo.lora.apply(model, rank=4, targets="all-linear", dropout=dropout,
                           key=jax.random.key(1))  # fmt: skip
    return randomize_adapters(model)


def test_a_model_drops_its_adapters_inputs_in_training_only():
    tokens = jnp.array([1, 5, 9, 4, 7, 3], jnp.int32)
    model = adapted_gpt(0.5)
    key = jax.random.key(3)
    call = eqx.filter_jit(lambda model, key: model(tokens, key=key))
    evaluated = call(model, None)  # no key (evaluation): no dropout
    np.testing.assert_array_equal(call(eqx.nn.inference_mode(model), key), evaluated)
    trained = call(model, key)
    assert float(jnp.abs(trained - evaluated).max()) > 1e-2
    np.testing.assert_array_equal(call(model, key), trained)  # the key decides the mask
    # each example of a batch draws its own masks from its own key
    two = eqx.filter_jit(jax.vmap(call, in_axes=(None, 0)))(model, jax.random.split(key, 2))
    assert float(jnp.abs(two[0] - two[1]).max()) > 1e-2


def test_the_dropout_is_recorded_and_written_for_peft(tmp_path):
    model = adapted_gpt(0.1)
    layout = describe(model)
    assert {entry["dropout"] for entry in layout.values()} == {0.1}
    rebuilt = rebuild(zoo.create("gpt-tiny", key=jax.random.key(0)), layout)
    assert {layer.dropout for layer in zoo.lora.lora_layers(rebuilt).values()} == {0.1}
    zoo.lora.save_adapter(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["lora_dropout"] == 0.1


def test_dropout_options_are_checked():
    assert parse_lora("rank=4,dropout=0.05") == LoRASpec(4, 8.0, ("attention",), None, 0.05)
    for bad in ("dropout=1", "dropout=-0.1", "dropout=nan", "dropout=some"):
        with pytest.raises(ValueError, match=r"dropout=.* is not a share in \[0, 1\)"):
            parse_lora(bad)
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    with pytest.raises(ValueError, match="LoRA dropout must be a share"):
        zoo.lora.apply(model, dropout=1.0, key=jax.random.key(1))
    classifier = zoo.create("classifier-tiny", key=jax.random.key(0))
    with pytest.raises(ValueError, match="not head: drop dropout, or leave head out"):
        zoo.lora.apply(classifier, rank=2, targets="attention,head", dropout=0.1,
                       key=jax.random.key(1))  # fmt: skip


def test_a_saved_model_keeps_its_dropout(tmp_path):
    zoo.save(adapted_gpt(0.1), tmp_path)
    loaded = zoo.load(tmp_path)
    assert {layer.dropout for layer in zoo.lora.lora_layers(loaded).values()} == {0.1}
