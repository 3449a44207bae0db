"""Export a one-block MoE classifier's gate and experts as separately servable artifacts."""

from typing import Any

from torch import nn

from scaleforge.artifacts.parts import save_moe_parts
from scaleforge.train.hooks.base import TrainHook


class ExportMoEParts(TrainHook):
    """After training, next to the artifact: the gate and one classifier per expert (``moe_parts`` in
    the manifest), which the Serve MoE router deploys one by one."""

    def export(
        self,
        artifact_dir: str,
        model: nn.Module,
        spec: Any,
        *,
        input_dim: int,
        num_classes: int,
        dataset: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "moe_parts": save_moe_parts(
                artifact_dir, model, spec, input_dim=input_dim, num_classes=num_classes, dataset=dataset
            )
        }
