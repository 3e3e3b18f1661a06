"""A LoRA train step's compiled memory, from shapes: XLA's `memory_analysis()` of the step.

The model is SmolLM2-135M's shape (vocabulary 49,152, width 576, SwiGLU 1,536, 9 heads over 3
key/value heads) with fewer layers, LoRA rank 8 on the attention projections, as
`zoo train gpt --lora rank=8,targets=attention` builds it. The step is lowered and compiled,
never run. Two depths give the bytes one more layer adds to the step's temporaries: the
intermediates the backward pass keeps of that layer.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

import zoo
from zoo.tasks.language_modeling import loss_chunk_bytes
from zoo.tasks.vocab_loss import loss_chunks
from zoo.train.step import make_train_step

BATCH, SEQ = 4, 64
FLOAT = 4  # bytes of a float32
SHAPE = dict(max_positions=SEQ + 1)


def adapted(num_layers: int):
    model = zoo.create("smollm2-135m", key=jax.random.key(0), num_layers=num_layers, **SHAPE)
    return zoo.lora.apply(model, rank=8, alpha=16, targets="attention", key=jax.random.key(1))


def compiled_memory(model):
    """The step's memory analysis, the bytes of the model and of the optimizer state, and the
    model."""
    optimizer = zoo.lora.only_adapters(zoo.train.adamw(2e-4))
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(zoo.tasks.LanguageModeling(), optimizer)
    tokens = np.random.default_rng(0).integers(3, 49152, (BATCH, SEQ + 1)).astype(np.int32)
    lowered = step.lower(model, state, {"tokens": tokens}, jax.random.key(2), 1)
    analysis = lowered.compile().compiled.memory_analysis()
    return analysis, _bytes(model), _bytes(state), model


def _bytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array)))


def layer_products(config) -> int:
    """Floats per token of one layer's matrix products: query, key, value, the scores, the
    attention's output and its projection, the gate, up and down projections, and the
    layer's input."""
    kv_width = config.kv_heads * config.head_dim
    scores = config.num_heads * SEQ
    d_ff = config.layers.block.feed_forward.d_ff
    return 2 * d_ff + 4 * config.d_model + 2 * kv_width + scores + config.d_model


@pytest.fixture(scope="module")
def two_and_four():
    return compiled_memory(adapted(2)), compiled_memory(adapted(4))


def test_a_layer_keeps_at_most_twice_its_matrix_products(two_and_four):
    (two, *_), (four, _, _, model) = two_and_four
    config = model.config
    per_layer = (four.temp_size_in_bytes - two.temp_size_in_bytes) / 2
    tokens = BATCH * SEQ
    # 2 * 6,912 floats per token; keeping every elementwise intermediate of the frozen base
    # (SwiGLU's gate, softmax, norms) took 27,370
    assert per_layer <= 2 * layer_products(config) * tokens * FLOAT


def test_the_step_holds_one_base_and_adapter_sized_optimizer_state(two_and_four):
    _, (four, model_bytes, state_bytes, model) = two_and_four
    config = model.config
    adapters = sum(leaf.nbytes for leaf in zoo.lora.adapter_arrays(model).values())
    assert state_bytes <= 2 * adapters + 64  # AdamW's two moments and counts, the base none
    batch = BATCH * (SEQ + 1) * 4
    # arguments: the model, the state, the batch and the key and step number, nothing else
    assert model_bytes + state_bytes + batch <= four.argument_size_in_bytes
    assert four.argument_size_in_bytes <= model_bytes + state_bytes + batch + 64
    # temporaries: the loss's few [tokens, vocab] float32 buffers and a transposed copy of the
    # tied embedding, plus the layers' kept products
    tokens = BATCH * SEQ
    logits = tokens * config.vocab_size * FLOAT
    embedding = config.vocab_size * config.d_model * FLOAT
    layers = config.num_layers * 2 * layer_products(config) * tokens * FLOAT
    assert four.temp_size_in_bytes <= 6 * logits + embedding + layers


def test_the_default_step_keeps_layer_inputs_and_one_chunk_of_logits(two_and_four):
    """With `apply`'s default recomputation a layer keeps little more than its input, and the
    loss holds a few chunks' float32 logits at a time, never all positions' (XLA's temporaries
    are then a transposed copy of the tied embedding, a few chunks and the layers' inputs)."""
    (two, *_), (four, _, _, model) = two_and_four
    config = model.config
    tokens = BATCH * SEQ
    layer_input = tokens * config.d_model * FLOAT
    per_layer = (four.temp_size_in_bytes - two.temp_size_in_bytes) / 2
    assert per_layer <= 2 * layer_input  # 1.2 times here
    chunk = -(-tokens // loss_chunks(tokens, config.vocab_size, loss_chunk_bytes()))
    chunk_logits = chunk * config.vocab_size * FLOAT
    embedding = config.vocab_size * config.d_model * FLOAT
    # 268.9 MB; keeping every chunk's float32 logits for the backward pass took 319.2 MB
    bound = embedding + 7 * chunk_logits + config.num_layers * 2 * layer_input
    assert four.temp_size_in_bytes <= bound


def test_apply_recomputes_the_layers_unless_the_config_chose():
    def lora(remat):
        model = zoo.create("llama-tiny", key=jax.random.key(0), remat=remat)
        return zoo.lora.apply(model, rank=2, targets="attention", key=jax.random.key(1))

    assert (lora(None).config.remat, lora(None).layers.remat) == ("full", "full")
    assert (lora("full").config.remat, lora("full").layers.remat) == ("full", "full")
