"""The CUDA program of every flavor, traced and lowered on the CPU: no GPU needed.

For each family shape (a GPT-2-like decoder, a padded GPT, a Llama-like decoder with grouped
keys and a sliding window, a padded classifier, a padded translator with cross-attention, T5)
and each path (bf16 train step, forward, greedy decoding, beam search, a step on a mesh), the
program is lowered for CUDA as an H100 would compile it (`cuda_program.py`), and the test reads
the cuDNN fused-attention calls in it: forward and backward, each causal, padded or both, and
no mask turned into an additive bias. Where cuDNN cannot serve a call (a window after a cache
fill known only at run time), the call runs XLA's attention and the log says so once. Odd
lengths, which cuDNN's training rule refuses, are padded to even ones.

These are the checks that would have caught the first H100 run's crash (main at ddc6d28: a
boolean mask handed to cuDNN under `jax.vmap` raised a TypeError for every masked model);
`test_the_old_mask_reproduces_the_h100_crash` shows the same error appears here.
"""

from __future__ import annotations

import logging
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_program import (
    as_if_on_a_gpu,
    cuda_text,
    fused_calls,
    kinds,
    lowering_unavailable,
    separate_traces,
)

import zoo
from zoo.decoding.beam import beam_search, repeat_rows
from zoo.decoding.generate import gpt_step, start_gpt_decoding
from zoo.decoding.loop import Stopping
from zoo.decoding.translate import start_translation, translator_step
from zoo.nn import KernelOptions, Mask, kernel
from zoo.nn.attention import dot_product_attention
from zoo.train import cast_floating

reason = lowering_unavailable()
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))

BATCH, SEQ = 4, 32
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0)
FORWARD, BACKWARD = "forward", "backward"

# name: (preset, overrides); every one bf16 on the GPU path, without attention dropout
FAMILIES = {
    "gpt2-like": ("gpt-tiny", dict(pad_id=None)),
    "gpt-padded": ("gpt-tiny", dict()),
    "llama-gqa-window": ("llama-tiny", {"attention.window": 8}),
    "classifier-padded": ("classifier-tiny", dict()),
    "translator-padded": ("translator-tiny", dict()),
    "t5": (
        "t5-small",
        dict(
            vocab_size=64,
            d_model=64,
            num_heads=4,
            num_layers=2,
            d_ff=128,
            max_positions=64,
            **{"attention.head_dim": 16, "cross_attention.head_dim": 16},
        ),
    ),
}
# (direction, mask type) of the fused calls of each family's train step
TRAIN_KINDS = {
    "gpt2-like": {(FORWARD, "CAUSAL"), (BACKWARD, "CAUSAL")},
    "gpt-padded": {(FORWARD, "PADDING_CAUSAL"), (BACKWARD, "PADDING_CAUSAL")},
    "llama-gqa-window": {(FORWARD, "PADDING_CAUSAL"), (BACKWARD, "PADDING_CAUSAL")},
    "classifier-padded": {(FORWARD, "PADDING"), (BACKWARD, "PADDING")},
    # encoder and cross-attention padded, decoder self-attention causal
    "translator-padded": {
        (FORWARD, "PADDING"),
        (BACKWARD, "PADDING"),
        (FORWARD, "CAUSAL"),
        (BACKWARD, "CAUSAL"),
    },
    "t5": {(FORWARD, "PADDING"), (BACKWARD, "PADDING"), (FORWARD, "CAUSAL"), (BACKWARD, "CAUSAL")},
}


FLAVORS = {zoo.GPT: "gpt", zoo.Classifier: "classifier", zoo.Translator: "translator"}


def flavor_of(model) -> str:
    return FLAVORS[type(model)]


def model_of(family: str, **more):
    preset, overrides = FAMILIES[family]
    return zoo.create(preset, key=jax.random.key(0), **{**overrides, **NO_DROPOUT, **more})


def padded_tokens(vocab: int, width: int = SEQ) -> jnp.ndarray:
    """Rows of 1..width real tokens (ids >= 3), right-padded with 0."""
    lengths = np.array([width, width - 5, width // 2, 3])[:BATCH]
    ids = 3 + np.arange(width)[None, :] % (vocab - 3)
    return jnp.asarray(np.where(np.arange(width)[None, :] < lengths[:, None], ids, 0), jnp.int32)


def batch_of(family: str, model) -> dict[str, jnp.ndarray]:
    vocab = model.config.vocab_size
    flavor = flavor_of(model)
    if flavor == "gpt":
        return {"tokens": padded_tokens(vocab, SEQ + 1)}
    if flavor == "classifier":
        return {"tokens": padded_tokens(vocab), "labels": jnp.arange(BATCH) % 2}
    return {"src": padded_tokens(vocab), "tgt": padded_tokens(vocab, SEQ + 1)}


@pytest.fixture(scope="module", autouse=True)
def traces_of_this_module_only():
    with separate_traces():
        yield


@pytest.fixture(autouse=True)
def fresh_log():
    """Fallback messages are logged once per process: start each test with none said."""
    kernel._said.clear()
    yield
    kernel._said.clear()


def train_text(family: str, mesh: str | None = None) -> str:
    model = model_of(family)
    task = zoo.tasks.for_flavor(flavor_of(model))
    trainer = zoo.Trainer(task, precision="bf16", mesh=mesh)
    state = trainer.init_optimizer(model)

    def step(model, state, batch, key):
        return trainer.train_step(model, state, batch, key, 1)

    return cuda_text(step, model, state, batch_of(family, model), jax.random.key(1))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_bf16_train_step_runs_cudnn_forward_and_backward(family, caplog):
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        text = train_text(family)
    calls = fused_calls(text)
    assert {call.kind for call in calls} == TRAIN_KINDS[family]
    with_bias = {call.name for call in calls if "Bias" in call.name}
    # a mask never reaches cuDNN as an additive bias; only T5's relative positions are one
    assert bool(with_bias) == (family == "t5"), with_bias
    assert all("bf16" in call.operands for call in calls)
    if family == "llama-gqa-window":
        assert {call.sliding_window for call in calls} == {8}
        # grouped-query attention: 4 query heads read 2 key/value heads, nothing repeated
        assert any(
            "x4x16xbf16>, tensor<" in c.operands and "x2x16xbf16>" in c.operands for c in calls
        )
    assert not caplog.records, [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_bf16_forward_runs_cudnn(family):
    model = cast_floating(model_of(family), jnp.bfloat16)
    batch = batch_of(family, model)
    if "src" in batch:
        text = cuda_text(
            lambda m, s, t: jax.vmap(m)(s, t), model, batch["src"], batch["tgt"][:, :-1]
        )
    else:
        text = cuda_text(lambda m, t: jax.vmap(m)(t), model, batch["tokens"])
    expected = {kind for kind in TRAIN_KINDS[family] if kind[0] == FORWARD}
    assert kinds(text) == expected


def gpt_decoding(model, prompts, lengths, *, beams: int):
    """Prefill, then one decoding step (beams == 1) or two beam-search steps."""
    caches = start_gpt_decoding(model, prompts, lengths, prompts.shape[1] + 4)
    last = jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]
    if beams == 1:
        return gpt_step(model, last, caches)
    tokens, scores, _ = beam_search(
        lambda tokens, caches: gpt_step(model, tokens, caches),
        caches,
        last,
        stopping=Stopping(2, model.config.end_ids, fill_id=0),
        beam_size=beams,
        alpha=0.6,
    )
    return tokens, scores


def translator_decoding(model, src, *, beams: int):
    memory, caches = start_translation(model, src, 6)
    bos = jnp.full((src.shape[0],), model.config.bos_id, jnp.int32)
    if beams == 1:
        return translator_step(model, memory, bos, caches)
    rows = repeat_rows(memory, beams)
    tokens, scores, _ = beam_search(
        lambda tokens, caches: translator_step(model, rows, tokens, caches),
        caches,
        bos,
        stopping=Stopping(2, model.config.eos_id, fill_id=0),
        beam_size=beams,
        alpha=0.6,
    )
    return tokens, scores


# (forward) mask types of the decoding calls, and whether a call falls back to XLA
DECODE_KINDS = {
    # prefill: the prompt in causal order; each step: one query over the filled cache
    "gpt2-like": ({"CAUSAL", "PADDING"}, False),
    "gpt-padded": ({"CAUSAL", "PADDING"}, False),
    # a window after a run-time cache fill is not a length: the steps run XLA's attention
    "llama-gqa-window": ({"CAUSAL"}, True),
    # self-attention over the filled cache, cross-attention over the real source tokens
    "translator-padded": ({"PADDING"}, False),
    # T5's bias on a single query: padded to two queries, so cuDNN serves it too
    "t5": ({"PADDING"}, False),
}


@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beam"])
@pytest.mark.parametrize("family", sorted(DECODE_KINDS))
def test_decoding_runs_cudnn_where_it_can_and_says_where_it_cannot(family, beams, caplog):
    model = cast_floating(model_of(family), jnp.bfloat16)
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        if flavor_of(model) == "gpt":
            prompts = padded_tokens(model.config.vocab_size, 12)
            lengths = jnp.sum(prompts != 0, axis=1).astype(jnp.int32)
            text = cuda_text(
                lambda m, p, n: gpt_decoding(m, p, n, beams=beams), model, prompts, lengths
            )
        else:
            src = padded_tokens(model.config.vocab_size, 12)
            text = cuda_text(lambda m, s: translator_decoding(m, s, beams=beams), model, src)
    calls = fused_calls(text)
    expected, falls_back = DECODE_KINDS[family]
    assert calls and not any(call.backward for call in calls)
    assert {call.mask_type for call in calls} == expected
    messages = [record.getMessage() for record in caplog.records]
    assert bool(messages) == falls_back, messages
    assert all("running XLA's attention" in message for message in messages)


# (queries, keys, mask) whose odd lengths JAX's cuDNN training rule refuses ("Unsupported
# sequence length"): the second H200 run's failure (a decoding step differentiated)
ODD_LENGTHS = {
    "causal-7": (7, 7, lambda: Mask(causal=True), "CAUSAL"),
    "causal-7-padded": (7, 7, lambda: Mask(causal=True, key_length=jnp.int32(5)), "PADDING_CAUSAL"),
    "decode-1-over-192": (1, 192, lambda: Mask(causal=True, offset=jnp.int32(100)), "PADDING"),
    "cross-8-over-9": (8, 9, lambda: Mask(key_length=jnp.int32(5)), "PADDING"),
}


@pytest.mark.parametrize("case", sorted(ODD_LENGTHS))
def test_odd_lengths_train_with_cudnn(case):
    """The gradient of a cuDNN call of odd lengths lowers, forward and backward on cuDNN: the
    operands are padded to even lengths and the key lengths leave the added key out. The call
    alone (inference: a decoding step over its cache) runs cuDNN on the operands as they are,
    with no padded copy."""
    seq, kv_seq, mask, mask_type = ODD_LENGTHS[case]

    def one(query, key, value):
        output, _ = dot_product_attention(query, key, value, mask(), options=KernelOptions("cudnn"))
        return output

    def loss(query, key, value):
        return jnp.sum(jax.vmap(one)(query, key, value).astype(jnp.float32))

    query = jax.ShapeDtypeStruct((2, seq, 4, 64), jnp.bfloat16)
    key = jax.ShapeDtypeStruct((2, kv_seq, 4, 64), jnp.bfloat16)
    text = cuda_text(jax.grad(loss, argnums=(0, 1, 2)), query, key, key)
    calls = fused_calls(text)
    assert {call.kind for call in calls} == {(FORWARD, mask_type), (BACKWARD, mask_type)}
    even = f"tensor<2x{seq + seq % 2}x4x64xbf16>, tensor<2x{kv_seq + kv_seq % 2}x4x64xbf16>"
    assert all(call.operands.startswith(f"({even}") for call in calls), calls[0].operands
    alone = fused_calls(cuda_text(jax.vmap(one), query, key, key))
    assert [call.kind[0] for call in alone] == [FORWARD]
    given = f"tensor<2x{seq}x4x64xbf16>, tensor<2x{kv_seq}x4x64xbf16>"
    assert alone[0].operands.startswith(f"({given}"), alone[0].operands


@pytest.mark.distributed
def test_a_step_on_a_mesh_runs_cudnn():
    pytest.importorskip("orbax.checkpoint", reason="a mesh needs the distributed extra")
    text = train_text("gpt-padded", mesh="data=1")
    assert kinds(text) == TRAIN_KINDS["gpt-padded"]


def test_float32_and_attention_dropout_take_other_kernels_and_say_so(caplog):
    """cuDNN takes bf16/fp16 only: float32 runs XLA's fused attention; attention dropout needs
    the weights and runs zoo's explicit softmax. Each is logged once."""
    model = model_of("classifier-padded")
    tokens = padded_tokens(model.config.vocab_size)
    with caplog.at_level(logging.WARNING, logger="zoo.nn"):
        text = cuda_text(lambda m, t: jax.vmap(m)(t), model, tokens)
        assert not fused_calls(text)
        dropping = model_of("classifier-padded", attention_dropout=0.1)
        text = cuda_text(
            lambda m, t, k: jax.vmap(m)(t, key=jax.random.split(k, BATCH)),
            cast_floating(dropping, jnp.bfloat16),
            tokens,
            jax.random.key(0),
        )
        assert not fused_calls(text)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert "takes bf16 or fp16, not float32" in messages[0]
    assert "attention_dropout=0 lets it run fused" in messages[1]


def test_the_old_mask_reproduces_the_h100_crash():
    """What main did at ddc6d28: a boolean mask given to cuDNN under the per-example vmap.
    Lowered here, it raises the H100's TypeError at trace time."""
    query = jnp.zeros((BATCH, SEQ, 4, 16), jnp.bfloat16)
    valid = jnp.arange(SEQ)[None, :] < jnp.array([SEQ, 20, 9, 3])[:, None]

    def old(q, valid):
        mask = jnp.broadcast_to(valid[None, :], (SEQ, SEQ))
        return jax.nn.dot_product_attention(q, q, q, mask=mask[None], implementation="cudnn")

    with as_if_on_a_gpu(), pytest.raises(TypeError, match="cannot reshape array of shape"):
        jax.jit(jax.vmap(old)).trace(query, valid).lower(lowering_platforms=("cuda",))


def test_the_mask_value_lowers_where_the_old_mask_crashed():
    """The same attention through zoo: the padding goes to cuDNN as key lengths."""
    query = jax.random.normal(jax.random.key(0), (BATCH, SEQ, 4, 16), jnp.bfloat16)
    lengths = jnp.array([SEQ, 20, 9, 3], jnp.int32)

    def ours(q, length):
        mask = zoo.nn.Mask(key_length=length)
        return zoo.nn.dot_product_attention(q, q, q, mask)[0]

    calls = fused_calls(cuda_text(jax.vmap(ours), query, lengths))
    assert [call.kind for call in calls] == [(FORWARD, "PADDING")]
    assert eqx.is_array(query)


def float32_sizes(text: str) -> list[int]:
    """Element counts of every float32 tensor type in a lowered program."""
    return [
        int(np.prod([int(d) for d in dims.split("x")]))
        for dims in re.findall(r"tensor<([0-9x]+)xf32>", text)
    ]


# preset -> (layers, vocabulary, the vocabulary padded to a multiple of 128)
DEFAULT_STEPS = {"gpt2": (12, 50257, 50304), "smollm2-135m": (30, 49152, 49152)}


@pytest.mark.parametrize("preset", sorted(DEFAULT_STEPS))
def test_the_published_shapes_train_with_the_gpu_defaults(preset):
    """16 x 1024 tokens in bf16, no options, as an H100 would run it (shapes only, nothing
    allocated): the layers unrolled (one cuDNN causal call per layer, forward and backward),
    the LM head's matmul over the vocabulary padded to a multiple of 128, and no float32
    tensor as large as [tokens, vocab] anywhere (the loss works a chunk at a time)."""
    layers, vocab, padded = DEFAULT_STEPS[preset]
    model = eqx.filter_eval_shape(
        lambda key: zoo.create(preset, key=key, **NO_DROPOUT), jax.random.key(0)
    )
    trainer = zoo.Trainer(zoo.tasks.LanguageModeling(), precision="bf16")
    state = eqx.filter_eval_shape(trainer.init_optimizer, model)
    batch = {"tokens": jax.ShapeDtypeStruct((16, 1025), jnp.int32)}

    def step(model, state, batch, key):
        return trainer.train_step(model, state, batch, key, 1)

    text = cuda_text(step, model, state, batch, jax.random.key(1))
    calls = fused_calls(text)
    assert sorted(call.kind for call in calls) == sorted(
        [(FORWARD, "CAUSAL")] * layers + [(BACKWARD, "CAUSAL")] * layers
    )
    assert re.search(rf"stablehlo\.dot_general .*-> tensor<\d+x{padded}xbf16>", text)
    assert max(float32_sizes(text)) < 16 * 1024 * vocab


def test_the_whole_vocabulary_in_float32_is_what_the_size_check_finds():
    """The check above can fail: the logits of a whole gpt-tiny batch through `token_losses`
    (what the loss did before it worked in chunks) hold a float32 [tokens, vocab] tensor."""
    from zoo.tasks.base import token_losses

    model = cast_floating(model_of("gpt2-like"), jnp.bfloat16)
    tokens = padded_tokens(model.config.vocab_size, SEQ + 1)

    def whole(model, tokens):
        logits = jax.vmap(model)(tokens[:, :-1])
        return jnp.sum(token_losses(logits, tokens[:, 1:])[0])

    text = cuda_text(eqx.filter_grad(whole), model, tokens)
    assert max(float32_sizes(text)) >= BATCH * SEQ * model.config.vocab_size
