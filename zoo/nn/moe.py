"""Mixture of experts: a router picks `top_k` of `num_experts` gated feed-forwards per token.

`MoEFeedForward` is a block's feed-forward beside the dense `FeedForward`, chosen by its
settings (`MoESettings`). Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE are settings of it:

- the router is one linear map to `num_experts` scores, normalised by a softmax (or, as in
  DeepSeek-V3, a sigmoid whose choice adds a per-expert bias); each token keeps its `top_k`
  experts, their weights renormalised to sum to one or not (`normalize_top_k`);
- the experts are gated feed-forwards (`act(x Wg) * (x Wu) Wd`) stacked in one array each. They
  run dropless: the token copies are sorted by expert and every expert multiplies its own run
  of rows in one grouped matmul (`jax.lax.ragged_dot`), so no token is dropped and no expert
  computes a token it was not given. `implementation="dense"` runs every expert on every token
  and masks the result: the reference the grouped path is tested against;
- an optional shared expert (Qwen2-MoE) sees every token; a sigmoid gate scales its output.
- each stacked projection may instead be a module with the same grouped product: int8 experts
  (`zoo.nn.quantized.QuantizedExperts`) or a rank-r adapter per expert on a frozen base
  (`zoo.nn.lora.LoRAExperts`), both run through the same `ragged_dot` grouping (`project`).

The call returns the output and `RouterStats`, sums over the sequence's real tokens from which
the task forms the load-balancing loss and the router z-loss (`router_losses`).
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.nn.feedforward import ACTIVATIONS, FeedForward, FeedForwardSettings, check_activation
from zoo.nn.linear import Init, Linear

ROUTERS = ("softmax", "sigmoid")
MOE_IMPLEMENTATIONS = ("ragged", "dense")


@dataclass(frozen=True, kw_only=True)
class MoESettings:
    """What a `MoEFeedForward` is, besides its input width and initialisation (HuggingFace's
    names in the comments)."""

    num_experts: int = 8  # routed experts per layer (num_local_experts, num_experts)
    top_k: int = 2  # experts each token is sent to (num_experts_per_tok)
    d_ff: int = 1024  # hidden width of each routed expert (moe_intermediate_size)
    shared_d_ff: int = 0  # hidden width of the shared expert; 0: none
    shared_gate: bool = True  # a sigmoid gate on the shared expert's output (Qwen2-MoE)
    normalize_top_k: bool = True  # renormalise the top-k weights to sum to 1 (norm_topk_prob)
    router: str = "softmax"  # softmax | sigmoid (with a per-expert selection bias, DeepSeek-V3)
    activation: str = "silu"  # of the gated experts
    aux_loss_coef: float = 0.0  # load-balancing loss weight in the objective (Mixtral: 0.02)
    z_loss_coef: float = 0.0  # router z-loss weight in the objective
    implementation: str = "ragged"  # ragged (grouped matmul, dropless) | dense (reference)

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; a token can be sent "
                "to at most every expert"
            )
        shared = self.shared_d_ff
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise ValueError(
                f"shared_d_ff must be an integer >= 0 (0: no shared expert), got {shared!r}"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.implementation not in MOE_IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {MOE_IMPLEMENTATIONS}, got {self.implementation!r}"
            )
        check_activation(self.activation)
        for name in ("aux_loss_coef", "z_loss_coef"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def active_experts_width(self) -> int:
        """Hidden width a token passes through: its top-k experts and the shared expert."""
        return self.top_k * self.d_ff + self.shared_d_ff


class RouterStats(eqx.Module):
    """Sums over one sequence's real tokens (and, stacked then summed, over layers and a batch)
    from which the router losses follow: they add up, the losses are formed at the end."""

    expert_tokens: Float[Array, "*layers experts"]  # tokens sent to each expert (top-k slots)
    expert_probability: Float[Array, "*layers experts"]  # router probability, summed
    tokens: Float[Array, "*layers"]  # routed tokens
    z_sum: Float[Array, "*layers"]  # sum of logsumexp(router logits) ** 2

    def total(self) -> RouterStats:
        """Everything summed down to one `[experts]` vector and scalars (layers, batch)."""
        return RouterStats(
            self.expert_tokens.reshape(-1, self.expert_tokens.shape[-1]).sum(0),
            self.expert_probability.reshape(-1, self.expert_probability.shape[-1]).sum(0),
            self.tokens.sum(),
            self.z_sum.sum(),
        )


def router_losses(stats: RouterStats) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(load-balancing loss, z-loss) of summed router statistics.

    The load-balancing loss is Switch Transformer's, in Mixtral's form (transformers'
    `load_balancing_loss_func`, every layer's tokens pooled): `num_experts * sum_e f_e * P_e`,
    `f_e` the share of top-k slots given to expert e and `P_e` its mean router probability;
    `top_k` when the load is uniform. The z-loss (ST-MoE) is the mean of
    `logsumexp(router logits) ** 2`.
    """
    total = stats.total()
    count = jnp.maximum(total.tokens, 1.0)
    share, probability = total.expert_tokens / count, total.expert_probability / count
    balance = share.shape[-1] * jnp.sum(share * probability)
    return balance, total.z_sum / count


def expert_load(stats: RouterStats) -> Float[Array, ""]:
    """The busiest expert's tokens over the mean expert's (1: perfectly balanced)."""
    tokens = stats.total().expert_tokens
    return jnp.max(tokens) / jnp.maximum(jnp.mean(tokens), 1e-9)


# -- the grouped matmul ----------------------------------------------------------------------


@custom_vmap
def grouped_matmul(
    rows: Float[Array, "rows d_in"],
    weights: Float[Array, "experts d_in d_out"],
    group_sizes: Int[Array, " experts"],
) -> Float[Array, "rows d_out"]:
    """`rows` sorted by expert (the first `group_sizes[0]` rows are expert 0's, ...), each
    multiplied by its expert's matrix: `jax.lax.ragged_dot`.

    Under `jax.vmap` (a batch of sequences sharing the experts) the batch's rows are regrouped
    by expert across the examples and multiplied in one grouped matmul, so the experts'
    weights are never copied per example (`ragged_dot`'s own batching rule would broadcast them).
    """
    return jax.lax.ragged_dot(rows, weights, group_sizes)


@grouped_matmul.def_vmap
def _grouped_matmul_batched(axis_size, in_batched, rows, weights, group_sizes):
    rows_batched, weights_batched, sizes_batched = in_batched
    if weights_batched:  # per-example experts: nothing to share, take the primitive's rule
        rows = rows if rows_batched else jnp.broadcast_to(rows, (axis_size, *rows.shape))
        if not sizes_batched:
            group_sizes = jnp.broadcast_to(group_sizes, (axis_size, *group_sizes.shape))
        return jax.vmap(jax.lax.ragged_dot)(rows, weights, group_sizes), True
    if not rows_batched:
        rows = jnp.broadcast_to(rows, (axis_size, *rows.shape))
    if not sizes_batched:
        group_sizes = jnp.broadcast_to(group_sizes, (axis_size, *group_sizes.shape))
    batch, num_rows = rows.shape[:2]
    # row r of example b is expert e's (r - start[b, e])-th row of that example; across the
    # batch it goes after expert e's rows of the earlier examples
    ends = jnp.cumsum(group_sizes, axis=1)
    starts = ends - group_sizes
    totals = jnp.sum(group_sizes, axis=0)
    expert_start = jnp.cumsum(totals) - totals
    earlier = jnp.cumsum(group_sizes, axis=0) - group_sizes
    index = jnp.arange(num_rows)
    expert = jax.vmap(lambda e: jnp.searchsorted(e, index, side="right"))(ends)
    expert = jnp.minimum(expert, group_sizes.shape[1] - 1)

    def at(table: Array) -> Array:
        return jnp.take_along_axis(table, expert, axis=1)

    destination = (expert_start[expert] + at(earlier) + index[None, :] - at(starts)).reshape(-1)
    flat = rows.reshape(batch * num_rows, rows.shape[-1])
    regrouped = jnp.zeros_like(flat).at[destination].set(flat, unique_indices=True)
    out = jax.lax.ragged_dot(regrouped, weights, totals)
    return out[destination].reshape(batch, num_rows, -1), True


# -- the part ----------------------------------------------------------------------------------


def project(
    weight: Float[Array, "experts d_in d_out"] | eqx.Module,
    rows: Float[Array, "rows d_in"],
    group_sizes: Int[Array, " experts"],
) -> Float[Array, "rows d_out"]:
    """`rows` (sorted by expert) through one stacked expert projection: a float array, or a
    module with a `grouped` method (int8 experts, LoRA on the experts: `zoo.nn.quantized`,
    `zoo.nn.lora`)."""
    if isinstance(weight, eqx.Module):
        return weight.grouped(rows, group_sizes)  # type: ignore[attr-defined]
    return grouped_matmul(rows, weight, group_sizes)


def project_every(
    weight: Float[Array, "experts d_in d_out"] | eqx.Module, x: Float[Array, "*lead seq d_in"]
) -> Float[Array, "experts seq d_out"]:
    """Every row of `x` through every expert's projection (`x` may carry an `experts` axis)."""
    if isinstance(weight, eqx.Module):
        return weight.every(x)  # type: ignore[attr-defined]
    spec = "esd,edf->esf" if x.ndim == 3 else "sd,edf->esf"
    return jnp.einsum(spec, x, weight)


def row_experts(group_sizes: Int[Array, " experts"], num_rows: int) -> Int[Array, " rows"]:
    """The expert of each of `num_rows` rows sorted by expert (`group_sizes` rows each)."""
    ends = jnp.cumsum(group_sizes)
    expert = jnp.searchsorted(ends, jnp.arange(num_rows), side="right")
    return jnp.minimum(expert, group_sizes.shape[0] - 1)


class Experts(eqx.Module):
    """`num_experts` gated feed-forwards, their matrices stacked on a leading `experts` axis.

    Each projection is a float array `[experts, in, out]`, or, after `zoo.lora.quantize` or
    `zoo.lora.apply`, a module computing the same grouped product: `QuantizedExperts` (int8)
    or `LoRAExperts` (a frozen base plus a low-rank adapter per expert).
    """

    gate: Float[Array, "experts d_model d_ff"] | eqx.Module
    up: Float[Array, "experts d_model d_ff"] | eqx.Module
    down: Float[Array, "experts d_ff d_model"] | eqx.Module
    activation: str = eqx.field(static=True)

    def __init__(
        self, d_model: int, settings: MoESettings, *, init: Init, key: PRNGKeyArray
    ) -> None:
        gate_key, up_key, down_key = jax.random.split(key, 3)
        experts, width = settings.num_experts, settings.d_ff
        self.gate = init.normal(gate_key, (experts, d_model, width))
        self.up = init.normal(up_key, (experts, d_model, width))
        self.down = init.normal(down_key, (experts, width, d_model))
        self.activation = settings.activation

    @property
    def num_experts(self) -> int:
        return self.gate.shape[-3]  # type: ignore[union-attr]  # wrappers report the float shape

    def grouped(
        self, rows: Float[Array, "rows d_model"], group_sizes: Int[Array, " experts"]
    ) -> Float[Array, "rows d_model"]:
        """Each row through its expert; `rows` are sorted by expert, `group_sizes` per expert."""
        act = ACTIVATIONS[self.activation]
        hidden = act(project(self.gate, rows, group_sizes))
        hidden = hidden * project(self.up, rows, group_sizes)
        return project(self.down, hidden, group_sizes)

    def every(self, x: Float[Array, "seq d_model"]) -> Float[Array, "experts seq d_model"]:
        """Every token through every expert (the dense reference)."""
        act = ACTIVATIONS[self.activation]
        hidden = act(project_every(self.gate, x)) * project_every(self.up, x)
        return project_every(self.down, hidden)


class MoEFeedForward(eqx.Module):
    """A routed mixture of gated experts for one sequence `[seq, d_model]`; batch with
    `jax.vmap`. Returns the output and the sequence's `RouterStats`."""

    router: Linear
    selection_bias: Float[Array, " experts"] | None
    experts: Experts
    shared: FeedForward | None
    shared_gate: Linear | None
    top_k: int = eqx.field(static=True)
    normalize_top_k: bool = eqx.field(static=True)
    scoring: str = eqx.field(static=True)
    implementation: str = eqx.field(static=True)

    def __init__(
        self, d_model: int, settings: MoESettings, *, init: Init | None = None, key: PRNGKeyArray
    ) -> None:
        s, init = settings, Init() if init is None else init
        router_key, experts_key, shared_key, shared_gate_key = jax.random.split(key, 4)
        self.router = init.linear(d_model, s.num_experts, False, key=router_key)
        sigmoid = s.router == "sigmoid"
        self.selection_bias = jnp.zeros((s.num_experts,), init.dtype) if sigmoid else None
        self.experts = Experts(d_model, s, init=init, key=experts_key)
        self.shared, self.shared_gate = None, None
        if s.shared_d_ff:
            shared = FeedForwardSettings(
                d_ff=s.shared_d_ff, activation=s.activation, kind="gated", bias=False
            )
            self.shared = FeedForward(d_model, shared, init=init, key=shared_key)
            if s.shared_gate:
                self.shared_gate = init.linear(d_model, 1, False, key=shared_gate_key)
        self.top_k = s.top_k
        self.normalize_top_k = s.normalize_top_k
        self.scoring = s.router
        self.implementation = s.implementation

    @property
    def num_experts(self) -> int:
        return self.experts.num_experts

    def route(
        self, x: Float[Array, "seq d_model"]
    ) -> tuple[Float[Array, "seq experts"], Float[Array, "seq top_k"], Int[Array, "seq top_k"]]:
        """(router logits, weights of the chosen experts, their ids), in float32."""
        logits = self.router(x).astype(jnp.float32)
        if self.scoring == "softmax":
            probability = jax.nn.softmax(logits, axis=-1)
            choice = probability
        else:
            assert self.selection_bias is not None
            probability = jax.nn.sigmoid(logits)
            choice = probability + self.selection_bias.astype(jnp.float32)[None, :]
        _, chosen = jax.lax.top_k(choice, self.top_k)
        weights = jnp.take_along_axis(probability, chosen, axis=-1)
        if self.normalize_top_k:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return logits, weights, chosen

    def _ragged(self, x: Array, weights: Array, chosen: Array) -> Array:
        num_tokens = x.shape[0]
        flat_expert = chosen.reshape(-1)  # token t's k-th choice at t * top_k + k
        order = jnp.argsort(flat_expert, stable=True)
        group_sizes = jnp.zeros((self.num_experts,), jnp.int32).at[flat_expert].add(1)
        rows = x[order // self.top_k]
        out = self.experts.grouped(rows, group_sizes)
        unsorted = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
        per_choice = unsorted.reshape(num_tokens, self.top_k, -1)
        return jnp.einsum("skd,sk->sd", per_choice, weights.astype(x.dtype))

    def _dense(self, x: Array, weights: Array, chosen: Array) -> Array:
        every = self.experts.every(x)
        one_hot = jax.nn.one_hot(chosen, self.num_experts, dtype=weights.dtype)
        per_expert = jnp.einsum("sk,ske->se", weights, one_hot).astype(x.dtype)
        return jnp.einsum("esd,se->sd", every, per_expert)

    def __call__(
        self,
        x: Float[Array, "seq d_model"],
        *,
        valid: Bool[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, "seq d_model"], RouterStats]:
        """The mixture's output at every position and the router statistics of the positions
        where `valid` is True (every position by default)."""
        del key  # no dropout inside the experts
        logits, weights, chosen = self.route(x)
        run = self._ragged if self.implementation == "ragged" else self._dense
        out = run(x, weights, chosen)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = jax.nn.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out, self._stats(logits, chosen, valid)

    def _stats(self, logits: Array, chosen: Array, valid: Array | None) -> RouterStats:
        real = (
            jnp.ones(logits.shape[:1], jnp.float32) if valid is None else valid.astype(jnp.float32)
        )
        slots = jax.nn.one_hot(chosen, self.num_experts, dtype=jnp.float32).sum(axis=1)
        probability = jax.nn.softmax(logits, axis=-1)
        z = jax.nn.logsumexp(logits, axis=-1) ** 2
        return RouterStats(
            expert_tokens=real @ slots,
            expert_probability=real @ probability,
            tokens=jnp.sum(real),
            z_sum=jnp.sum(real * z),
        )
