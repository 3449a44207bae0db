"""What a model family tells the parallel strategies about itself (torchtitan keeps this per model).

The strategies in this package never name a model's modules: each model family supplies a
:class:`ParallelPlan` next to its architecture (``scaleforge.models.plans``), and the trainer
hands it over. A family that leaves a field empty cannot be split that way.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from torch import nn


def _none(model: nn.Module) -> list:
    return []


@dataclass(frozen=True)
class ParallelPlan:
    """How one model family is split across ranks."""

    tensor_parallel: Optional[Callable[[nn.Module], dict[str, Any]]] = None
    """``model -> {module name: ColwiseParallel() / RowwiseParallel() ...}`` for DTensor's
    ``parallelize_module``; ``None``: no tensor parallelism."""
    pipeline_stage: Optional[Callable[[nn.Module, int, int], nn.Module]] = None
    """``(model, stage, stages) -> model`` reduced in place to that pipeline stage, parameters
    keeping their names; ``None``: no pipeline parallelism."""
    fsdp_units: Callable[[nn.Module], list[nn.Module]] = _none
    """Submodules sharded as their own FSDP units (one gathered at a time); the root always is one."""
    expert_layers: Callable[[nn.Module], list[nn.Module]] = _none
    """Mixture-of-Experts layers for expert parallelism: each has ``num_experts``, an ``experts``
    ModuleList, a replaceable ``dispatcher`` and an ``all_reduce`` statistics hook."""
    tied_parameters: Callable[[nn.Module], list[str]] = _none
    """Names of parameters used by more than one pipeline stage (a tied embedding): every stage
    that holds one keeps a copy, and their gradients are summed across the pipeline."""


DENSE = ParallelPlan()
"""A model that only data parallelism and FSDP (as one unit) can split."""
