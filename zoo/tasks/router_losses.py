"""The router losses of a mixture-of-experts model, added to a task's summed statistics.

A model with experts returns its routers' statistics beside its output (`zoo.models.Routed`:
sums over layers and real tokens, `zoo.nn.moe`), in every flavor. The task sums them over the
batch and forms the load-balancing loss and the z-loss of the batch; the objective gains
`aux_loss_coef * balance + z_loss_coef * z` (the experts' `MoESettings`) per scored position,
and both losses and the busiest expert's load (1 = balanced) are logged as named sums
(`Stats.extra`: `router_aux_loss`, `router_z_loss`, `expert_load`). Routing is dropless, so no
token is ever dropped. With gradient accumulation each micro-batch forms its own losses, as
transformers does per forward pass.
"""

from __future__ import annotations

from zoo.nn.moe import RouterStats, expert_load, router_losses
from zoo.tasks.base import Stats, TaskModel


def with_router_losses(stats: Stats, router: RouterStats | None, model: TaskModel) -> Stats:
    """`stats` with the router losses of `model` added, weighted as its experts' settings say;
    unchanged for a dense model."""
    if router is None:  # a dense model
        return stats
    experts = model.config.experts()
    if experts is None:
        return stats
    return add_router_losses(stats, router, experts.aux_loss_coef, experts.z_loss_coef)


def add_router_losses(
    stats: Stats, router: RouterStats | None, aux_coef: float, z_coef: float
) -> Stats:
    """`stats` with the router losses of `router` (None: a dense model, unchanged) added."""
    if router is None:
        return stats
    balance, z = router_losses(router)
    weight = stats.weight
    extra = {
        **stats.extra,
        "router_aux_loss": balance * weight,
        "router_z_loss": z * weight,
        "expert_load": expert_load(router) * weight,
    }
    loss_sum = stats.loss_sum + (aux_coef * balance + z_coef * z) * weight
    return Stats(loss_sum, stats.nll_sum, weight, stats.correct, extra)
