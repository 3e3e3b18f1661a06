"""The floor peer, timed like zoo: plain JAX (`zoo.bench.floor`) on the same weights and batch.

Its train step, forward and greedy decoding are timed in the same rounds as zoo's and the
PyTorch peer's; its fields start with `floor_`, and `floor_ratio` is zoo's train tokens/s over
the floor's (1.0: zoo's code costs nothing beyond what XLA makes of the plain program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo import presets
from zoo.bench import floor
from zoo.bench.report import BenchRow
from zoo.bench.timing import Timed, Timer
from zoo.bench.workload import BenchSpec, make_batch, make_prompts
from zoo.models import GPT, Classifier
from zoo.train import PRECISIONS


class FloorRun:
    """The floor side of a row: `timers` (started by `start`, sampled in turns with the
    others'), and `fields` for the row. Its weights are those zoo's run starts from (the same
    preset, seed and shapes)."""

    def __init__(self, spec: BenchSpec):
        self.spec = spec
        config = spec.config()
        compute = PRECISIONS[spec.precision]
        self.model = floor.Floor.of(config)
        model = presets.build(config, key=jax.random.key(spec.seed))
        if not isinstance(model, GPT | Classifier):
            raise TypeError(f"the floor has a GPT and a classifier, not a {type(model).__name__}")
        params = floor.floor_params(model)
        batch = {name: jnp.asarray(value) for name, value in make_batch(spec).items()}
        gpt = spec.flavor == "gpt"
        loss = self.model.gpt2_loss if gpt else self.model.bert_loss
        step, init = floor.make_train_step(loss, compute, lr=1e-4)

        def train(state):
            params, opt_state, _ = state
            return step(params, opt_state, batch)

        self.train: Timed = Timed(train, (params, init(params), None))

        @jax.jit
        def forward(params):
            weights = floor.cast(params, compute)
            if not gpt:
                return self.model.bert_logits(weights, batch["tokens"])
            features = self.model.gpt2_features(weights, batch["tokens"][:, :-1])
            return features @ weights["token"].T  # the tied head

        self.timers: dict[str, Timer] = {
            "train": self.train,
            "inference": Timed(lambda _: forward(self.params)),
        }
        if gpt and spec.decodes:
            prompts = jnp.asarray(make_prompts(spec))
            decode = jax.jit(self.model.greedy_decode, static_argnums=2)
            self.timers["decode"] = Timed(
                lambda _: decode(floor.cast(self.params, compute), prompts, spec.decode_tokens)
            )

    @property
    def params(self) -> floor.Params:
        """The latest weights: what the last train step returned."""
        assert self.train.state is not None
        return self.train.state[0]

    def start(self) -> None:
        with jax.numpy_dtype_promotion("standard"):
            for timer in self.timers.values():
                timer.start(self.spec.warmup)

    def fields(self) -> BenchRow:
        spec, tokens = self.spec, self.spec.tokens_per_step()
        assert self.train.state is not None
        loss = self.train.state[2]
        decode = self.timers.get("decode")
        return dict(
            floor_tokens_per_s=tokens / self.train.median_s,
            floor_train_step_s=self.train.median_s,
            floor_compile_s=self.train.compile_s,
            floor_loss=None if loss is None else float(loss),
            floor_inference_tokens_per_s=tokens / self.timers["inference"].median_s,
            floor_decode_tokens_per_s=None
            if decode is None
            else spec.batch * spec.decode_tokens / decode.median_s,
        )
