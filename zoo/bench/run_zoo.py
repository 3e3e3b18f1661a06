"""Measure zoo on one `BenchSpec`: the trainer's train step, a jitted forward, KV-cache decoding."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol, TypeAlias, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from zoo import presets, tasks
from zoo.bench.flops import train_flops
from zoo.bench.hardware import Peak, mfu, peak_memory, xla_settings
from zoo.bench.report import BenchRow
from zoo.bench.timing import Timed, Timer
from zoo.bench.workload import BenchSpec, make_batch, make_prompts
from zoo.nn.embedding import ids_checked_on_host
from zoo.train import PRECISIONS, adamw, cast_floating
from zoo.train.step import StepOutput, make_train_step

# What the train timer hands from step to step: the model, the optimizer state and the last
# step's output (None before the first step).
TrainState: TypeAlias = tuple[eqx.Module, PyTree, StepOutput | None]


@runtime_checkable
class CompiledStep(Protocol):
    """equinox's `Compiled`: the XLA executable in `compiled`."""

    compiled: jax.stages.Compiled


@runtime_checkable
class LoweredStep(Protocol):
    """What `TrainStep.lower` returns (equinox's `Lowered`)."""

    def compile(self) -> CompiledStep: ...


def model_inputs(flavor: str, batch: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
    """The arrays the model reads in a training step: what the inference forward is given."""
    if flavor == "gpt":
        return (batch["tokens"][:, :-1],)
    if flavor == "classifier":
        return (batch["tokens"],)
    return batch["src"], batch["tgt"][:, :-1]


def make_forward(precision: str) -> Callable[..., jax.Array]:
    """A jitted batched forward: fp32 weights cast to the compute dtype, `jax.vmap` over examples.

    Its inputs' token ids are checked on the host before it runs (the bench checks its one
    batch once), as the trainer's eval step does: no check inside the program."""
    compute = PRECISIONS[precision]

    @eqx.filter_jit
    def forward(model, inputs):
        with ids_checked_on_host():
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


class ZooRun:
    """The zoo side of a row: the train step, the forward and (GPT) decoding, ready to time.

    `timers` are started (compiled, warmed up) by `start`, then sampled, possibly interleaved
    with the peer's; `fields` turns the timings into the row's zoo fields. The forward and the
    decoder read the model the train step has just produced (the step donates the old one).
    """

    def __init__(self, spec: BenchSpec, peak: Peak, measured_peak: Peak | None = None):
        self.spec = spec
        self.peak = peak  # the datasheet peak: `mfu`
        self.measured_peak = measured_peak or Peak(None, None, "no measured peak given")
        config = spec.config()
        key = jax.random.key(spec.seed)
        model = presets.build(config, key=key)
        self.params = presets.count_params(model)
        self.flops = train_flops(model, spec.batch, spec.seq)
        optimizer = adamw(lr=1e-4)
        opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
        layout = None
        if spec.mesh is not None:  # the model, optimizer state and batch split over devices
            from zoo.distributed import Layout

            layout = Layout.of(spec.mesh)
            model, opt_state = layout.place(model), layout.place(opt_state)
        # the program `zoo train` runs: the batch's ids are checked on the host (once: the same
        # batch every step), not by a check inside the program (a branch each step)
        task = tasks.for_flavor(spec.flavor)
        train_step = make_train_step(
            task, optimizer, precision=spec.precision, layout=layout, host_checks=True
        )
        host_batch = make_batch(spec)
        task.check_batch(host_batch, model)
        batch = (
            {name: jnp.asarray(value) for name, value in host_batch.items()}
            if layout is None
            else layout.place_batch(host_batch)
        )
        step_numbers = itertools.count()
        self.train_step, self.batch, self.key = train_step, batch, key

        def train(state: TrainState | None) -> TrainState:
            if state is None:
                raise RuntimeError("the train step needs the model and the optimizer state")
            model, opt_state, _ = state
            return train_step(model, opt_state, batch, key, next(step_numbers), checked=True)

        self.train: Timed[TrainState] = Timed(train, (model, opt_state, None))
        self.decode_error: str | None = None
        self.memory: dict[str, int | None] = {}
        forward = make_forward(spec.precision)
        inputs = model_inputs(spec.flavor, batch)
        self.timers: dict[str, Timer] = {
            "train": self.train,
            "inference": Timed(lambda _: forward(self.model, inputs)),
        }
        if spec.decodes:
            decode = make_greedy_decode(spec.decode_prompt, spec.decode_tokens, spec.precision)
            prompts = jnp.asarray(make_prompts(spec))
            self.timers["decode"] = Timed(lambda _: decode(self.model, prompts))

    @property
    def model(self) -> eqx.Module:
        """The latest model: what the last train step returned."""
        return self.train_state()[0]

    def train_state(self) -> TrainState:
        """The train timer's state (it starts with the model and optimizer state)."""
        if self.train.state is None:
            raise RuntimeError("the train timer lost its state")
        return self.train.state

    def lowered_step(self) -> LoweredStep:
        """The train step lowered for the latest model (in JAX's caches once it has run)."""
        model, opt_state, _ = self.train_state()
        with jax.numpy_dtype_promotion("standard"):
            lowered = self.train_step.lower(model, opt_state, self.batch, self.key, 0)
        if not isinstance(lowered, LoweredStep):
            raise TypeError(f"TrainStep.lower gave a {type(lowered).__name__}, not a Lowered")
        return lowered

    def start(self) -> None:
        """First (compiling) call and warm-up of each timer, the train step first."""
        # bf16 attention promotes internally, which JAX's strict promotion mode refuses; the
        # train step sets its own scope.
        with jax.numpy_dtype_promotion("standard"):
            for name, timer in list(self.timers.items()):
                try:
                    timer.start(self.spec.warmup)
                except Exception as error:
                    if name != "decode":
                        raise
                    # Decoding is a side measurement: its failure goes into the row.
                    self.decode_error = f"decode failed: {type(error).__name__}: {error}"
                    del self.timers[name]
        self.memory = self.compiled_memory()

    def compiled_memory(self) -> dict[str, int | None]:
        """XLA's memory analysis of the compiled train step (the first call compiled it: this
        reads JAX's cache). Temporaries, and arguments + outputs not donated + temporaries."""
        try:
            stats = self.lowered_step().compile().compiled.memory_analysis()
        except Exception:  # a backend without the analysis: the row's timings stand
            stats = None
        if stats is None:
            return {"train_temp_bytes": None, "train_program_bytes": None}
        held = (
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes
        )
        return {"train_temp_bytes": int(stats.temp_size_in_bytes), "train_program_bytes": int(held)}

    def fields(self) -> BenchRow:
        spec, train = self.spec, self.train
        step_s = train.median_s
        spread = train.spread()
        tokens = spec.tokens_per_step()
        inference = self.timers["inference"]
        output = self.train_state()[2]
        fields: BenchRow = dict(
            params=self.params,
            flop_params=self.flops.params,
            flops_per_token=self.flops.flops_per_token,
            tokens_per_step=tokens,
            train_step_s=step_s,
            train_step_min_s=spread["min_s"],
            train_step_max_s=spread["max_s"],
            train_step_round_medians_s=list(spread["round_medians_s"]),
            tokens_per_s=tokens / step_s,
            mfu=mfu(self.flops.flops_per_step, step_s, self.peak),
            mfu_peak=self.peak.label,
            mfu_reason=self.peak.reason,
            mfu_measured=mfu(self.flops.flops_per_step, step_s, self.measured_peak),
            mfu_measured_peak=self.measured_peak.label,
            mfu_measured_reason=self.measured_peak.reason,
            compile_s=train.compile_s,
            xla_compile_s=train.backend_compile_s,
            first_step_s=train.first_s,
            loss=None if output is None else float(output.stats.loss),
            inference_step_s=inference.median_s,
            inference_tokens_per_s=tokens / inference.median_s,
            inference_compile_s=inference.compile_s,
        )
        decode = self.timers.get("decode")
        if decode is None:
            if self.decode_error is not None:
                why = self.decode_error
            elif spec.flavor == "gpt":
                why = "not asked for (--decode-tokens 0)"
            else:
                why = "KV-cache decoding is measured for the GPT"
            fields.update(decode_tokens_per_s=None, decode_compile_s=None, decode_reason=why)
        else:
            fields.update(
                decode_tokens_per_s=spec.batch * spec.decode_tokens / decode.median_s,
                decode_compile_s=decode.compile_s,
                decode_reason=None,
            )
        memory, reason = peak_memory()
        fields.update(peak_memory_bytes=memory, peak_memory_reason=reason, **self.memory)
        fields["xla_settings"] = xla_settings()
        return fields
