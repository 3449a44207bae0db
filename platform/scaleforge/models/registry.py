"""The registry of model families (torchtitan's train spec): everything the platform asks of a model.

A family is its torch-free spec (fields and :class:`~scaleforge.config.capabilities.Capabilities`,
in :mod:`scaleforge.config.models`), its builder, its parallel plan, its auxiliary loss, the extra
files exported beside its artifact and, for a network with several exits, its per-exit
probabilities. The trainer, the exporter and the serving side look a family up by the spec's
``name`` and never compare it; the built-in families are registered in
:mod:`scaleforge.models.families`.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from scaleforge.config.models import MODEL_NAMES
from scaleforge.distributed.plan import DENSE, ParallelPlan

if TYPE_CHECKING:  # the strategies' module imports DTensor (0.8 s), which pre-flights need not pay
    from scaleforge.distributed.strategy import Batch

AuxiliaryLoss = Callable[[nn.Module, "Batch"], "torch.Tensor | float"]
"""``(model, batch) -> loss`` added to the task loss, from the model's last forward pass."""
Export = Callable[..., dict[str, Any]]
"""``(artifact_dir, model, spec, *, input_dim, num_classes, dataset) -> manifest entries``: files
written beside the artifact after training (the MoE family's gate and experts)."""
ExitProbabilities = Callable[[nn.Module, torch.Tensor], list[torch.Tensor]]
"""``(model, x) -> [probabilities of each exit, first to last]``, each ``[batch, classes]``."""


def no_auxiliary_loss(model: nn.Module, batch: "Batch") -> float:
    return 0.0


@dataclass(frozen=True)
class ModelFamily:
    """One registered model family."""

    spec: type
    """Its spec class (a pydantic model in :mod:`scaleforge.config.models` with a ``name`` literal
    and ``capabilities``)."""
    build: Callable[[Any, int, int], nn.Module]
    """``(spec, input_dim, num_classes) -> nn.Module``."""
    plan: ParallelPlan = DENSE
    """How the strategies split it (:mod:`scaleforge.models.plans`)."""
    auxiliary_loss: AuxiliaryLoss = no_auxiliary_loss
    """Terms the trainer adds to every step's task loss (MoE balancing, a side exit's cross-entropy)."""
    export: Optional[Export] = None
    """Extra files beside the trained artifact, and their manifest entries."""
    exit_probabilities: Optional[ExitProbabilities] = None
    """Each exit's class probabilities, for a network with ``capabilities.exits > 1``."""

    @property
    def name(self) -> str:
        return self.spec.model_fields["name"].default


_FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add ``family`` to the registry, after checking that its spec and its code agree.

    Raises:
        ValueError: the spec is not in :data:`~scaleforge.config.models.ModelSpec`, the name is taken,
            or the capabilities claim a split the plan cannot do (or the other way round).
    """
    name = family.name
    if name not in MODEL_NAMES:
        raise ValueError(f"model family {name!r}: add its spec to scaleforge.config.models (ModelSpec)")
    capabilities = family.spec.capabilities
    claims = {"tp": family.plan.tensor_parallel, "pp": family.plan.pipeline_stage}
    for split, how in claims.items():
        if (split in capabilities.splits) != (how is not None):
            raise ValueError(f"model family {name!r}: capabilities.splits and its plan disagree on {split}")
    if (capabilities.exits > 1) != (family.exit_probabilities is not None):
        raise ValueError(f"model family {name!r}: capabilities.exits > 1 needs exit_probabilities")
    if name in _FAMILIES:
        raise ValueError(f"model family {name!r} is registered twice")
    _FAMILIES[name] = family
    return family


def model_family(name: str) -> ModelFamily:
    """The registered family called ``name`` (a spec's or a manifest's ``model.name``)."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown model {name!r}; registered models: {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def registered() -> tuple[str, ...]:
    """The registered family names, in registration order."""
    return tuple(_FAMILIES)
