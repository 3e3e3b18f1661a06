"""Measure zoo on one `BenchSpec`: the trainer's train step, a jitted forward, KV-cache decoding."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from zoo import presets, tasks
from zoo.bench.flops import train_flops
from zoo.bench.hardware import Peak, mfu, peak_memory
from zoo.bench.timing import time_calls
from zoo.bench.workload import BenchSpec, make_batch, make_prompts
from zoo.train import PRECISIONS, adamw, cast_floating
from zoo.train.step import make_train_step


def model_inputs(flavor: str, batch: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
    """The arrays the model reads in a training step: what the inference forward is given."""
    if flavor == "gpt":
        return (batch["tokens"][:, :-1],)
    if flavor == "classifier":
        return (batch["tokens"],)
    return batch["src"], batch["tgt"][:, :-1]


def make_forward(precision: str) -> Callable[..., jax.Array]:
    """A jitted batched forward: fp32 weights cast to the compute dtype, `jax.vmap` over examples."""
    compute = PRECISIONS[precision]

    @eqx.filter_jit
    def forward(model, inputs):
        return jax.vmap(cast_floating(model, compute))(*inputs)

    return forward


def make_greedy_decode(
    prompt_len: int, new_tokens: int, precision: str
) -> Callable[..., jax.Array]:
    """A jitted greedy decoder: prefill `prompt_len` tokens, then `lax.scan` over `GPT.extend`.

    Returns `int32[batch, new_tokens]`. A deliberately small loop for timing, not a generation
    library: no sampling, no stop tokens.
    """
    compute = PRECISIONS[precision]

    @eqx.filter_jit
    def decode(model, prompts):
        model = cast_floating(model, compute)

        def one(prompt):
            cache = model.init_cache(prompt_len + new_tokens, dtype=compute)
            logits, cache = model.extend(prompt, cache)
            first = jnp.argmax(logits[-1]).astype(jnp.int32)

            def body(carry, _):
                token, cache = carry
                logits, cache = model.extend(token[None], cache)
                return (jnp.argmax(logits[-1]).astype(jnp.int32), cache), token

            (last, _), tokens = jax.lax.scan(body, (first, cache), None, length=new_tokens - 1)
            return jnp.concatenate([tokens, last[None]])

        return jax.vmap(one)(prompts)

    return decode


def measure_zoo(spec: BenchSpec, peak: Peak) -> dict[str, Any]:
    """Time the train step, the forward and (GPT) decoding of `spec`; return the zoo's fields."""
    config = spec.config()
    key = jax.random.key(spec.seed)
    model = presets.build(config, key=key)
    flops = train_flops(model, spec.batch, spec.seq)
    task = tasks.for_flavor(spec.flavor)
    optimizer = adamw(lr=1e-4)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    train_step = make_train_step(task, optimizer, precision=spec.precision)
    batch = {name: jnp.asarray(value) for name, value in make_batch(spec).items()}
    step_numbers = itertools.count()

    def train(state):
        model, opt_state, _ = state
        return train_step(model, opt_state, batch, key, next(step_numbers))

    timing = dict(steps=spec.steps, warmup=spec.warmup)
    train_time, (model, _, output) = time_calls(train, (model, opt_state, None), **timing)
    step_s = train_time.median_s
    fields: dict[str, Any] = dict(
        params=presets.count_params(model),
        flop_params=flops.params,
        flops_per_token=flops.flops_per_token,
        tokens_per_step=spec.tokens_per_step(),
        train_step_s=step_s,
        tokens_per_s=spec.tokens_per_step() / step_s,
        mfu=mfu(flops.flops_per_step, step_s, peak),
        mfu_reason=peak.reason,
        compile_s=train_time.compile_s,
        first_step_s=train_time.first_s,
        loss=float(output.stats.loss),
    )

    # bf16 attention promotes internally, which JAX's strict promotion mode refuses.
    with jax.numpy_dtype_promotion("standard"):
        forward = make_forward(spec.precision)
        inputs = model_inputs(spec.flavor, batch)
        infer_time, _ = time_calls(lambda _: forward(model, inputs), None, **timing)
        fields.update(
            inference_step_s=infer_time.median_s,
            inference_tokens_per_s=spec.tokens_per_step() / infer_time.median_s,
            inference_compile_s=infer_time.compile_s,
        )
        fields.update(measure_decode(spec, model))

    memory, reason = peak_memory()
    fields.update(peak_memory_bytes=memory, peak_memory_reason=reason)
    return fields


def measure_decode(spec: BenchSpec, model: Any) -> dict[str, Any]:
    """Greedy KV-cache decoding of `decode_tokens` after a `decode_prompt`-token prompt (GPT)."""
    if not spec.decodes:
        why = "KV-cache decoding is measured for the GPT" if spec.flavor != "gpt" else "disabled"
        return dict(decode_tokens_per_s=None, decode_compile_s=None, decode_reason=why)
    decode = make_greedy_decode(spec.decode_prompt, spec.decode_tokens, spec.precision)
    prompts = jnp.asarray(make_prompts(spec))
    timing, _ = time_calls(
        lambda _: decode(model, prompts), None, steps=spec.steps, warmup=spec.warmup
    )
    return dict(
        decode_tokens_per_s=spec.batch * spec.decode_tokens / timing.median_s,
        decode_compile_s=timing.compile_s,
        decode_reason=None,
    )
