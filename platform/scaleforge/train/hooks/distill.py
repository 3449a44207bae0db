"""Knowledge distillation as a hook: the student learns from the teacher's logits as well as the labels."""

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from scaleforge.artifacts import load_model
from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.strategy import Batch
from scaleforge.train.hooks.base import TrainHook


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    alpha: float,
) -> torch.Tensor:
    """Hinton et al. 2015: ``alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, labels)``.

    The T^2 factor keeps the soft term's gradients on the same scale as the hard term's when T changes.
    """
    soft = F.kl_div(
        F.log_softmax(student_logits / temperature, dim=1),
        F.log_softmax(teacher_logits / temperature, dim=1),
        reduction="batchmean",
        log_target=True,
    )
    return alpha * temperature**2 * soft + (1.0 - alpha) * F.cross_entropy(student_logits, labels)


@functools.lru_cache(maxsize=2)
def cached_teacher(path: str) -> torch.nn.Module:
    """The teacher, loaded once per process (a Ray worker's) and verified by its checksum."""
    return load_model(path)


@dataclass
class Distillation(TrainHook):
    """Train on the training set's ``teacher_logits`` column (soft targets) plus the hard labels."""

    temperature: float
    alpha: float
    columns = {"teacher_logits": torch.float32}

    def check(self, dims: ParallelDims) -> None:
        if dims.model_split:
            raise ValueError("distillation trains data-parallel only; use parallel degrees of 1")

    def task_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return distillation_loss(
            logits, batch.extras["teacher_logits"], batch.y, self.temperature, self.alpha
        )

    def export(self, artifact_dir, model, spec, **shapes) -> dict[str, Any]:
        return {"training": {"distill": {"temperature": self.temperature, "alpha": self.alpha}}}
