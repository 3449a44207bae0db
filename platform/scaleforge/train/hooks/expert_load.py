"""Mixture-of-Experts routing statistics per epoch: how evenly the experts are loaded, what was dropped."""

from typing import Any

import torch.distributed as dist

from scaleforge.models.moe import expert_load, moe_layers
from scaleforge.train.hooks.base import TrainHook, WorkerContext


class ExpertLoad(TrainHook):
    """Per-epoch expert counts summed over every rank, their coefficient of variation, the busiest
    expert against the mean, and the share of assignments dropped for capacity (nothing for dense models)."""

    def on_epoch_start(self, ctx: WorkerContext, epoch: int) -> None:
        for layer in moe_layers(ctx.model.module):
            layer.reset_stats()

    def epoch_metrics(self, ctx: WorkerContext) -> dict[str, Any]:
        layers = moe_layers(ctx.model.module)
        if dist.is_initialized():
            for layer in layers:
                for buffer in (layer.expert_counts, layer.dropped, layer.routed):
                    dist.all_reduce(buffer)
        load = expert_load(ctx.model.module)
        if load is None:
            return {}
        return {
            "expert_counts": load["expert_counts"],
            "expert_load_cv": load["load_cv"],
            "expert_max_over_mean": load["max_over_mean_load"],
            "expert_dropped_fraction": load["dropped_fraction"],
        }

    def summary(self, metrics: dict[str, Any]) -> list[str]:
        if "expert_load_cv" not in metrics:
            return []
        return [
            f"expert load: cv {metrics['expert_load_cv']:.3f}, "
            f"busiest expert {metrics['expert_max_over_mean']:.2f}x "
            f"the mean, dropped {metrics['expert_dropped_fraction']:.2%} (counts {metrics['expert_counts']})"
        ]
