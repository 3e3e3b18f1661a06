"""Training on from a model that already has LoRA adapters (a LoRA SFT run, then DPO).

Two ways, as TRL and peft offer them:

- `"continue"` (the default, what TRL's trainers do with a `PeftModel`): the same adapters train
  further, from their trained values; their rank, alpha and targets are the model's, and a
  spec that asks for others is refused.
- `"merge"`: the adapters are folded into the base (`merge`, `peft`'s `merge_and_unload`) and
  new ones start on top (`apply`).

```python
sft = zoo.load("runs/sft")                       # a GPT with trained adapters
model = zoo.lora.chain(sft, "merge", rank=8, alpha=16, targets="attention", key=key)
```

For a DPO-style loss the reference is the model the run starts from: with `"merge"`, the new
adapters off (`zoo.tasks.Preference(reference="adapters")`); with `"continue"`, the adapters at
their starting values (`reference_adapters=zoo.tasks.adapter_values(sft)`). Either way the base
is held once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import equinox as eqx
from jaxtyping import PRNGKeyArray

from zoo.lora.adapters import apply, merge
from zoo.lora.targets import normalize_targets, select
from zoo.nn.lora import (
    describe,
    expert_projections,
    has_lora,
    lora_experts,
    lora_layers,
    plain_linears,
)

LORA_INIT_MODES = ("continue", "merge")
DEFAULT_LORA_INIT = "continue"  # TRL: a PeftModel given to a trainer trains its adapter further
Model = TypeVar("Model", bound=eqx.Module)


def adapter_summary(model: eqx.Module) -> str:
    """`"rank 4, alpha 8 on 4 projections (layers.blocks.attention.query_proj, ...)"`."""
    layout = describe(model)
    ranks = sorted({entry["rank"] for entry in layout.values()})
    alphas = sorted({entry["alpha"] for entry in layout.values()})
    paths = list(layout)
    shown = ", ".join(paths[:2]) + (", ..." if len(paths) > 2 else "")
    rank = "/".join(map(str, ranks))
    alpha = "/".join(f"{value:g}" for value in alphas)
    return f"rank {rank}, alpha {alpha} on {len(paths)} projections ({shown})"


def check_continues(
    model: eqx.Module,
    *,
    rank: int,
    alpha: float | int,
    targets: str | Sequence[str],
    merge_instead: str = 'zoo.lora.chain(model, "merge", ...)',
) -> None:
    """Refuse a spec (rank, alpha, targets) other than the one `model`'s adapters have;
    `merge_instead` says how to start new adapters instead (in the caller's words)."""
    layout = describe(model)
    candidates = [*plain_linears(model), *lora_layers(model), *expert_projections(model),
                  *lora_experts(model)]  # fmt: skip
    chosen = set(select(candidates, normalize_targets(targets)))
    same = chosen == set(layout) and all(
        entry["rank"] == rank and entry["alpha"] == alpha for entry in layout.values()
    )
    if not same:
        raise ValueError(
            f"LoRA rank={rank},alpha={alpha:g},targets={','.join(normalize_targets(targets))} is "
            f"not the adapters the model has ({adapter_summary(model)}), and they continue "
            f"training: give their own rank, alpha and targets, or start new adapters over the "
            f"merged base with {merge_instead}"
        )


def chain(
    model: Model,
    mode: str = DEFAULT_LORA_INIT,
    *,
    rank: int,
    alpha: float | int,
    targets: str | Sequence[str],
    key: PRNGKeyArray,
) -> Model:
    """The model to train from `model`, which already has LoRA adapters (see the module doc).

    Args:
        model: a model with trained adapters (`zoo.load` of a LoRA run).
        mode: "continue" (its adapters train further: the spec must be theirs) or "merge"
            (they are folded into the base and new adapters of the spec start on top).
        rank: the adapters' rank.
        alpha: their alpha (the scale is alpha / rank).
        targets: the layers they adapt (groups or path patterns, as `apply` takes them).
        key: draws the new adapters' `A` ("merge"; unused by "continue").
    """
    if mode not in LORA_INIT_MODES:
        raise ValueError(f"mode must be one of {LORA_INIT_MODES}, got {mode!r}")
    if not has_lora(model):
        raise ValueError("this model has no LoRA adapters to continue or merge (zoo.lora.apply)")
    if mode == "continue":
        check_continues(model, rank=rank, alpha=alpha, targets=targets)
        return model
    return apply(merge(model), rank=rank, alpha=alpha, targets=targets, key=key)
