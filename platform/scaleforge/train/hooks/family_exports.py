"""Export what the model family adds beside the artifact (an MoE's gate and experts, an early-exit
network's exits): the family's own ``export`` (:class:`scaleforge.models.ModelFamily`)."""

from typing import Any

from torch import nn

from scaleforge.models import model_family
from scaleforge.train.hooks.base import TrainHook


class FamilyExports(TrainHook):
    """After training, next to the artifact: the files and manifest entries the trained model's
    family exports (``moe_parts``, which the Serve MoE router deploys one by one; ``exits``)."""

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
        export = model_family(spec.name).export
        if export is None:
            return {}
        return export(
            artifact_dir, model, spec, input_dim=input_dim, num_classes=num_classes, dataset=dataset
        )
