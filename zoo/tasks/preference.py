"""Preference optimisation of a `zoo.GPT`: DPO, IPO, hinge, robust DPO, SimPO and ORPO.

A batch holds pairs of answers to one prompt, the chosen one first:

| key | shape | what |
| --- | --- | --- |
| `tokens` | `int32[batch, 2, seq]` | prompt + answer ids, right-padded; `[:, 0]` chosen, `[:, 1]` rejected |
| `loss_mask` | `int32[batch, 2, seq]` | 1 on the answer's tokens |
| `lengths` | `int32[batch, 2]` | real tokens of each row (the rest is padding) |
| `reference_logps` | `float32[batch, 2]` | optional: the reference model's answer log-probabilities |
| `loss_positions` | `int32[batch, 2, capacity]` | optional: the answer's target positions, then -1 (`zoo.tasks.positions`) |

Chosen and rejected rows go through the model as one batch of `2 * batch` rows (chosen rows
first), and their answers' log-probabilities come from `zoo.tasks.vocab_loss` row by row, so no
float32 `[tokens, vocab]` array is made; with `loss_positions` the output head runs on the
answers' positions only (the same log-probabilities). The loss is `zoo.tasks.PreferenceLoss`.

Where the reference log-probabilities come from (`reference=`):

- `"batch"` (the default): the batch's `reference_logps`, from a frozen model
  (`zoo.tasks.with_reference`: a copy of the starting weights or any model with the same
  tokenizer, on the fly or precomputed once);
- `"adapters"`: the trained model itself with its LoRA adapters off, inside the step: the base
  is the reference and no second copy is held. With `reference_adapters` (an `adapter_values`
  of the starting model), the adapters hold those values instead of being off: the reference of
  an adapter that continues training is the model it started from (TRL copies the adapter of a
  `PeftModel` into a frozen "ref" adapter for the same reason); only the adapters are kept twice.

SimPO and ORPO read no reference. Metrics (TRL's names): `rewards/chosen`, `rewards/rejected`,
`rewards/accuracies` (the headline), `rewards/margins`, `logps/chosen`, `logps/rejected`, and for
ORPO `nll_loss`, `log_odds_ratio`, `log_odds_chosen`; each is a mean over pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from zoo.nn.lora import LoRAExperts, LoRALinear, is_lora
from zoo.nn.moe import RouterStats
from zoo.tasks.base import LanguageModel, Stats, Task, check_ids, example_keys
from zoo.tasks.positions import check_loss_positions, scored_only
from zoo.tasks.preference_loss import PreferenceLoss, pair_losses
from zoo.tasks.router_losses import with_router_losses
from zoo.tasks.vocab_loss import vocab_statistics

REFERENCES = ("batch", "adapters")
REFERENCE_KEY = "reference_logps"
M = TypeVar("M")


def adapters_off(model: M) -> M:
    """`model` with each `LoRALinear` replaced by its base layer: the same arrays, no copy."""
    return jax.tree_util.tree_map(
        lambda node: node.base if is_lora(node) else node, model, is_leaf=is_lora
    )


def _is_adapter(node: object) -> bool:
    return isinstance(node, LoRALinear | LoRAExperts)


def adapter_values(model: object) -> list[tuple[Array, Array]]:
    """The `(lora_a, lora_b)` of every adapter of `model` (linear layers and experts), in
    pytree order: what `with_adapter_values` puts back."""
    nodes = jax.tree_util.tree_leaves(model, is_leaf=_is_adapter)
    return [(node.lora_a, node.lora_b) for node in nodes if _is_adapter(node)]


def with_adapter_values(model: M, values: list[tuple[Array, Array]]) -> M:
    """`model` with its adapters holding `values` (from `adapter_values` of a model with the same
    adapters), each cast to the dtype the model's adapter has now; every other array is shared."""
    found = len(adapter_values(model))
    if found != len(values):
        raise ValueError(
            f"the model has {found} LoRA adapters and the reference's values {len(values)}: take "
            "them with adapter_values of the model the run starts from"
        )
    remaining = iter(values)

    def swap(node: object) -> object:
        if not _is_adapter(node):
            return node
        lora_a, lora_b = next(remaining)
        assert isinstance(node, LoRALinear | LoRAExperts)
        if (lora_a.shape, lora_b.shape) != (node.lora_a.shape, node.lora_b.shape):
            raise ValueError(
                f"the reference's adapter values are {lora_a.shape} and {lora_b.shape}, the "
                f"model's adapter {node.lora_a.shape} and {node.lora_b.shape}: take them with "
                "adapter_values of the model the run starts from"
            )
        held = (jnp.asarray(lora_a, node.lora_a.dtype), jnp.asarray(lora_b, node.lora_b.dtype))
        return eqx.tree_at(lambda layer: (layer.lora_a, layer.lora_b), node, held)

    return jax.tree_util.tree_map(swap, model, is_leaf=_is_adapter)


def _rows(values: Array) -> Array:
    """`[batch, 2, ...]` -> `[2 * batch, ...]`: every chosen row, then every rejected row."""
    return jnp.concatenate([values[:, 0], values[:, 1]], axis=0)


def _pairs(values: Array) -> Array:
    """`[2 * batch, ...]` -> `[batch, 2, ...]`, undoing `_rows`."""
    half = values.shape[0] // 2
    return jnp.stack([values[:half], values[half:]], axis=1)


def answer_logps(
    model: LanguageModel, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None = None
) -> tuple[Float[Array, "batch 2"], Float[Array, "batch 2"]]:
    """`(log-probabilities, token counts)` of each pair's answers, summed over their tokens.

    One forward pass over the `2 * batch` rows; float32 log-softmax a chunk at a time.
    """
    logps, counts, _, _ = _row_statistics(model, batch, key=key, orpo=False)
    return logps, counts


def _features(
    model: LanguageModel, tokens: Array, lengths: Array, key: PRNGKeyArray | None
) -> tuple[Array, RouterStats | None]:
    """The features of every row's positions but the last (each predicts the next token), and
    the routers' statistics of a mixture of experts: over every real token, the last one too,
    as transformers' forward over the whole row counts them for the load-balancing loss."""
    keys = example_keys(key, tokens.shape[0])
    if model.config.experts() is None:

        def one(tokens, key):
            return model.features_and_router(tokens, key=key)

        return jax.vmap(one)(tokens[:, :-1], keys)
    real = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]

    def routed(tokens, mask, key):
        return model.features_and_router(tokens, mask, key=key)

    features, router = jax.vmap(routed)(tokens, real, keys)
    return features[:, :-1], router


def _row_statistics(
    model: LanguageModel, batch: Mapping[str, ArrayLike], *, key: PRNGKeyArray | None, orpo: bool
) -> tuple[Array, Array, Stats | None, RouterStats | None]:
    tokens = _rows(jnp.asarray(batch["tokens"]))
    answer = _rows(jnp.asarray(batch["loss_mask"]))[:, 1:] != 0
    lengths = _rows(jnp.asarray(batch["lengths"]))
    targets = tokens[:, 1:]
    real = jnp.arange(targets.shape[1])[None, :] + 1 < lengths[:, None]
    features, router = _features(model, tokens, lengths, key)
    head = model.output_head
    scored = (features, targets, answer & real)
    if "loss_positions" in batch:
        scored = scored_only(*scored, _rows(jnp.asarray(batch["loss_positions"])))
    per_row = jax.vmap(lambda f, t, w: vocab_statistics(head, f, t, w))(*scored)
    chosen_nll = None
    if orpo:  # TRL's ORPO: the chosen rows' NLL over every real token, prompt included
        half = tokens.shape[0] // 2
        chosen_nll = vocab_statistics(head, features[:half], targets[:half], real[:half])
    return _pairs(-per_row.nll_sum), _pairs(per_row.weight), chosen_nll, router


class Preference(Task[LanguageModel]):
    """Train a `zoo.GPT` on pairs of answers with a `PreferenceLoss` (see the module doc).

    ```python
    task = zoo.tasks.Preference(zoo.tasks.PreferenceLoss(kind="sigmoid", beta=0.1))
    batches = zoo.tasks.with_reference(pairs.train, model)  # the frozen starting weights
    model, history = zoo.Trainer(task, zoo.train.adamw(lr=5e-6)).fit(model, batches, ...)
    ```

    Args:
        loss: the loss and its settings (default: DPO's sigmoid loss, beta 0.1).
        reference: "batch" (the batch's `reference_logps`) or "adapters" (the model with its
            LoRA adapters off, or holding `reference_adapters`).
        reference_adapters: with `reference="adapters"`, the adapters' values the reference
            holds (`adapter_values` of the starting model: it is the reference, as when an
            adapter trained before continues); None: the adapters off, the base is the reference.
    """

    flavor = "gpt"
    metric_name = "rewards/accuracies"
    lower_is_better = False
    required: ClassVar[dict[str, str]] = {
        "tokens": "[batch, 2, seq]",
        "loss_mask": "[batch, 2, seq]",
        "lengths": "[batch, 2]",
    }
    optional: ClassVar[dict[str, str]] = {"loss_positions": "[batch, 2, capacity]"}

    def __init__(
        self,
        loss: PreferenceLoss | None = None,
        *,
        reference: str = "batch",
        reference_adapters: list[tuple[Array, Array]] | None = None,
    ):
        if loss is not None and not isinstance(loss, PreferenceLoss):
            raise TypeError(f"loss must be a zoo.tasks.PreferenceLoss, got {type(loss).__name__}")
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        if reference_adapters is not None and reference != "adapters":
            raise ValueError("reference_adapters go with reference='adapters'")
        self.loss = loss or PreferenceLoss()
        self.reference = reference
        self.reference_adapters = reference_adapters

    def reference_model(self, model: LanguageModel) -> LanguageModel:
        """The reference of `reference="adapters"`: `model` with its adapters off, or holding
        `reference_adapters`."""
        if self.reference_adapters is None:
            return adapters_off(model)
        return with_adapter_values(model, self.reference_adapters)

    def statistics(
        self,
        model: LanguageModel,
        batch: Mapping[str, ArrayLike],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Stats:
        loss = self.loss
        orpo = loss.kind == "orpo"
        logps, counts, chosen_nll, router = _row_statistics(model, batch, key=key, orpo=orpo)
        reference = None
        if loss.needs_reference:
            if self.reference == "adapters":
                reference, _ = answer_logps(self.reference_model(model), batch)
                reference = jax.lax.stop_gradient(reference)
            elif REFERENCE_KEY in batch:
                reference = jnp.asarray(batch[REFERENCE_KEY], jnp.float32)
        terms = pair_losses(loss, logps, reference, counts)
        pairs = jnp.asarray(logps.shape[0], jnp.float32)
        shown = jax.lax.stop_gradient(logps / jnp.maximum(counts, 1.0) if loss.averaged else logps)
        chosen, rejected = terms["chosen_rewards"], terms["rejected_rewards"]
        loss_sum = jnp.sum(terms["loss"])
        extra = {
            "rewards/chosen": jnp.sum(chosen),
            "rewards/rejected": jnp.sum(rejected),
            "rewards/margins": jnp.sum(chosen - rejected),
            "logps/chosen": jnp.sum(shown[:, 0]),
            "logps/rejected": jnp.sum(shown[:, 1]),
        }
        if chosen_nll is not None:  # ORPO: the batch's mean NLL, counted once per pair
            nll_mean = chosen_nll.nll_sum / jnp.maximum(chosen_nll.weight, 1.0)
            loss_sum = loss_sum + nll_mean * pairs
            extra["nll_loss"] = jax.lax.stop_gradient(nll_mean * pairs)
            extra["log_odds_ratio"] = jax.lax.stop_gradient(jnp.sum(terms["log_odds_ratio"]))
            extra["log_odds_chosen"] = jax.lax.stop_gradient(jnp.sum(terms["log_odds_chosen"]))
        stats = Stats(
            loss_sum=loss_sum,
            nll_sum=jax.lax.stop_gradient(-jnp.sum(logps[:, 0])),
            weight=pairs,
            correct=jnp.sum((chosen > rejected).astype(jnp.float32)),
            extra=extra,
        )
        return with_router_losses(stats, router, model)

    def metric(self, stats: Stats) -> Float[Array, ""]:
        return stats.accuracy

    def metrics(self, stats: Stats) -> dict[str, Float[Array, ""]]:
        return {**super().metrics(stats), "rewards/accuracies": stats.accuracy}

    def num_tokens(self, batch: Mapping[str, ArrayLike]) -> int:
        return int(np.size(batch["tokens"]))

    def check_batch(self, batch: Mapping[str, ArrayLike], model: LanguageModel) -> None:
        super().check_batch({k: v for k, v in batch.items() if k != REFERENCE_KEY}, model)
        if not (self.loss.needs_reference and self.reference == "batch"):
            return
        if REFERENCE_KEY not in batch:
            raise ValueError(
                f"the {self.loss.kind!r} loss compares with a reference model, and the batch "
                f"has no {REFERENCE_KEY!r}: wrap the batches with zoo.tasks.with_reference"
                "(batches, reference_model), or with LoRA use Preference(reference='adapters')"
            )
        values = np.asarray(batch[REFERENCE_KEY])
        pairs = np.shape(batch["tokens"])[0]
        if values.shape != (pairs, 2) or not np.issubdtype(values.dtype, np.floating):
            raise ValueError(
                f"batch[{REFERENCE_KEY!r}] must be float [batch, 2] = ({pairs}, 2), got "
                f"{values.dtype} {values.shape}"
            )

    def _check_values(self, batch: Mapping[str, np.ndarray], model: LanguageModel) -> None:
        config = model.config
        tokens = batch["tokens"]
        if tokens.shape[1] != 2 or batch["loss_mask"].shape != tokens.shape:
            raise ValueError(
                f"batch['tokens'] and batch['loss_mask'] must both be [batch, 2, seq] (chosen, "
                f"rejected), got {tokens.shape} and {batch['loss_mask'].shape}"
            )
        if batch["lengths"].shape != tokens.shape[:2]:
            raise ValueError(
                f"batch['lengths'] must be [batch, 2] = {tokens.shape[:2]}, got "
                f"{batch['lengths'].shape}"
            )
        flat = tokens.reshape(-1, tokens.shape[-1])
        check_ids("tokens", flat, config.vocab_size, config.max_positions, shifted=True)
        lengths = batch["lengths"]
        if lengths.min() < 2 or lengths.max() > tokens.shape[-1]:
            raise ValueError(
                f"batch['lengths'] must be in [2, {tokens.shape[-1]}] (a prompt token and an "
                f"answer token at least), got [{lengths.min()}, {lengths.max()}]"
            )
        positions = np.arange(tokens.shape[-1])
        scored = (batch["loss_mask"] != 0) & (positions > 0) & (positions < lengths[..., None])
        if "loss_positions" in batch:  # target position t predicts token t + 1
            check_loss_positions(batch["loss_positions"], scored[..., 1:])
        empty = np.argwhere(~scored.any(axis=-1))
        if len(empty):
            row, side = empty[0]
            raise ValueError(
                f"pair {row} of the batch has no {('chosen', 'rejected')[side]} answer token "
                "to score (loss_mask is 0 on every real token after the first)"
            )
