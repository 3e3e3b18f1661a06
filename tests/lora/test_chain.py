"""`zoo.lora.chain`: a model that already has adapters trains them further ("continue", with
their own spec only) or gets new ones over its merged base ("merge"), whose new adapters off
compute the starting model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zoo
from tests.lora.helpers import forward, randomize_adapters
from zoo.tasks import adapters_off


@pytest.fixture(scope="module")
def trained():
    model = zoo.create("gpt-tiny", key=jax.random.key(0))
    adapted = zoo.lora.apply(model, rank=4, alpha=8, targets="attention", key=jax.random.key(1))
    return randomize_adapters(adapted)


def test_continue_keeps_the_adapters_and_refuses_another_spec(trained):
    key = jax.random.key(2)
    same = zoo.lora.chain(trained, "continue", rank=4, alpha=8, targets="attention", key=key)
    assert same is trained  # nothing changes: the adapters train on from their values
    # the same layers named otherwise: the attention projections by their paths
    paths = ",".join(path.split(".")[-1] for path in zoo.lora.lora_layers(trained))
    zoo.lora.chain(trained, "continue", rank=4, alpha=8, targets=paths, key=key)
    for spec in ({"rank": 8, "alpha": 8}, {"rank": 4, "alpha": 16}):
        with pytest.raises(ValueError, match=r"rank 4, alpha 8 on 4 projections.*\"merge\""):
            zoo.lora.chain(trained, "continue", targets="attention", key=key, **spec)
    with pytest.raises(ValueError, match="not the adapters the model has"):
        zoo.lora.chain(trained, "continue", rank=4, alpha=8, targets="all-linear", key=key)


def test_merge_starts_new_adapters_whose_off_state_is_the_starting_model(trained):
    chained = zoo.lora.chain(
        trained, "merge", rank=2, alpha=2, targets="all-linear", key=jax.random.key(3)
    )
    layers = zoo.lora.lora_layers(chained)
    assert {layer.rank for layer in layers.values()} == {2}
    assert len(layers) > len(zoo.lora.lora_layers(trained))  # all-linear: more than attention
    # fresh adapters (B = 0) compute the merged model; with them off, the same
    np.testing.assert_allclose(forward(chained), forward(trained), rtol=0, atol=1e-5)
    np.testing.assert_allclose(forward(adapters_off(chained)), forward(trained), rtol=0, atol=1e-5)


def test_chain_needs_adapters_and_a_known_mode(trained):
    plain = zoo.lora.merge(trained)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        zoo.lora.chain(plain, rank=4, alpha=8, targets="attention", key=jax.random.key(0))
    with pytest.raises(ValueError, match="mode must be one of"):
        zoo.lora.chain(trained, "stack", rank=4, alpha=8, targets="attention",
                       key=jax.random.key(0))  # fmt: skip
