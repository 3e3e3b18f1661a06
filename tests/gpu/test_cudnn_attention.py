"""cuDNN attention under `jax.vmap` equals the XLA path in bf16, and is really the one compiled.

zoo's attention is per example and batched by `jax.vmap`; on a GPU in bf16 it asks
`jax.nn.dot_product_attention` for cuDNN's fused kernel. These checks compare it with the XLA
path and a float32 reference for causal, padded, causal-and-padded, windowed and cross
attention and a decoding step after a cache, forward and backward, and look for cuDNN's custom
call (`__cudnn$fmha...`) in the compiled program, so a silent fallback to XLA cannot pass as
cuDNN. The masks are `zoo.nn.Mask` values: cuDNN gets them as its own causal flag, sequence
lengths and window (`test_cuda_program.py` checks the same structure on a CPU).
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_checks import requires_cudnn

from zoo import presets
from zoo.nn import KernelOptions, Mask
from zoo.nn.attention import dot_product_attention
from zoo.train import cast_floating

pytestmark = [pytest.mark.gpu, requires_cudnn]

BATCH, HEADS, HEAD_DIM = 4, 4, 64
SEQ, CROSS_KV = 128, 192
# bf16 keeps 8 bits of mantissa (relative step 2^-8 = 0.4%); outputs are averages of unit
# normal values, so both paths land within a few bf16 steps of the float32 reference.
OUTPUT_ATOL = 3e-2
# gradients: max abs difference relative to the largest gradient entry
GRADIENT_RTOL = 5e-2
CUDNN_CALL = "__cudnn$fmha"


KINDS = ["causal", "padded", "causal-padded", "window", "cross", "decode"]


def inputs(kind: str):
    """(query, key, value, masks) for a batch: bf16 unit normals, one `Mask` per example."""
    kv_seq = CROSS_KV if kind in ("cross", "decode") else SEQ
    seq = 1 if kind == "decode" else SEQ
    keys = jax.random.split(jax.random.key(0), 3)
    query = jax.random.normal(keys[0], (BATCH, seq, HEADS, HEAD_DIM), jnp.bfloat16)
    key = jax.random.normal(keys[1], (BATCH, kv_seq, HEADS, HEAD_DIM), jnp.bfloat16)
    value = jax.random.normal(keys[2], (BATCH, kv_seq, HEADS, HEAD_DIM), jnp.bfloat16)
    # ragged key lengths: full, most, half, a single key
    lengths = jnp.array([kv_seq, kv_seq - 28, kv_seq // 2, 1], jnp.int32)

    def mask(length):
        return {
            "causal": Mask(causal=True),
            "padded": Mask(key_length=length),
            "causal-padded": Mask(causal=True, key_length=length),
            "window": Mask(causal=True, window=16),
            "cross": Mask(key_length=length),
            "decode": Mask(causal=True, offset=length - 1),  # the query sits at length - 1
        }[kind]

    return query, key, value, jax.vmap(mask)(lengths)


def attend(implementation: str | None):
    """Batched attention: the per-example function under `jax.vmap`, as the models run it."""

    def one(query, key, value, mask):
        output, _ = dot_product_attention(
            query, key, value, mask, options=KernelOptions(implementation)
        )
        return output

    return jax.vmap(one)


def loss(implementation: str | None):
    def total(query, key, value, mask, cotangent):
        output = attend(implementation)(query, key, value, mask)
        return jnp.sum(output.astype(jnp.float32) * cotangent)

    return jax.grad(total, argnums=(0, 1, 2))


@pytest.mark.parametrize("kind", KINDS)
def test_cudnn_forward_equals_xla_and_the_float32_reference(kind):
    query, key, value, mask = inputs(kind)
    with jax.numpy_dtype_promotion("standard"):
        cudnn = jax.jit(attend("cudnn"))
        text = cudnn.lower(query, key, value, mask).compile().as_text()
        assert CUDNN_CALL in text, "cuDNN attention was not compiled in (XLA fallback)"
        fast = np.asarray(cudnn(query, key, value, mask), np.float32)
        xla = np.asarray(jax.jit(attend("xla"))(query, key, value, mask), np.float32)
        as_f32 = [x.astype(jnp.float32) for x in (query, key, value)]
        reference = np.asarray(jax.jit(attend("xla"))(*as_f32, mask))
    np.testing.assert_allclose(fast, reference, atol=OUTPUT_ATOL, rtol=0)
    np.testing.assert_allclose(xla, reference, atol=OUTPUT_ATOL, rtol=0)
    np.testing.assert_allclose(fast, xla, atol=OUTPUT_ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_cudnn_backward_equals_xla(kind):
    query, key, value, mask = inputs(kind)
    cotangent = jax.random.normal(jax.random.key(1), query.shape, jnp.float32)
    with jax.numpy_dtype_promotion("standard"):
        cudnn = jax.jit(loss("cudnn"))
        text = cudnn.lower(query, key, value, mask, cotangent).compile().as_text()
        assert CUDNN_CALL in text and "Backward" in text, "no cuDNN backward kernel compiled"
        fast = cudnn(query, key, value, mask, cotangent)
        xla = jax.jit(loss("xla"))(query, key, value, mask, cotangent)
    for name, ours, theirs in zip(("query", "key", "value"), fast, xla):
        ours, theirs = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
        scale = np.abs(theirs).max()
        assert np.abs(ours - theirs).max() <= GRADIENT_RTOL * scale, f"d{name} differs ({kind})"


def test_gpt_with_cudnn_attention_matches_xla_and_compiles_the_kernel():
    """The whole model: bf16 GPT logits with cuDNN attention equal the XLA ones."""
    tokens = jax.random.randint(jax.random.key(2), (BATCH, SEQ), 0, 64)
    models = {
        choice: presets.create("gpt-tiny", attention_implementation=choice, key=jax.random.key(0))
        for choice in ("cudnn", "xla")
    }

    def logits(choice):
        params, static = eqx.partition(models[choice], eqx.is_array)

        @jax.jit
        def run(params, tokens):
            model = cast_floating(eqx.combine(params, static), jnp.bfloat16)
            return jax.vmap(model)(tokens).astype(jnp.float32)

        return run, params

    with jax.numpy_dtype_promotion("standard"):
        run, params = logits("cudnn")
        assert CUDNN_CALL in run.lower(params, tokens).compile().as_text()
        fast = np.asarray(run(params, tokens))
        run, params = logits("xla")
        xla = np.asarray(run(params, tokens))
    # logits of a 2-layer model at init are small (|logit| < 1): a few bf16 steps
    np.testing.assert_allclose(fast, xla, atol=3e-2, rtol=0)


@pytest.mark.parametrize(
    ("kind", "mask_type"),
    [("causal", "CAUSAL"), ("padded", "PADDING"), ("causal-padded", "PADDING_CAUSAL")],
)
def test_the_mask_reaches_cudnn_as_its_own_mask_type_forward_and_backward(kind, mask_type):
    """The causal order and key lengths reach cuDNN as its mask types, with no bias operand."""
    query, key, value, mask = inputs(kind)
    cotangent = jax.random.normal(jax.random.key(1), query.shape, jnp.float32)
    with jax.numpy_dtype_promotion("standard"):
        step = jax.jit(loss("cudnn"))
        text = step.lower(query, key, value, mask, cotangent).compile().as_text()
    calls = [line for line in text.splitlines() if CUDNN_CALL in line and "custom-call(" in line]
    assert calls, "cuDNN attention was not compiled in (XLA fallback)"
    assert all(re.search(rf"mask_type\W+{mask_type}\b", line) for line in calls), calls[0][:400]
    assert not any("Bias" in line.split("custom_call_target=")[-1][:40] for line in calls)
