"""Knowledge distillation on Ray Train: a classifier's teacher logits are computed once with Ray Data
and ride along as a dataset column; a language model's teacher runs on each batch in the workers
(its token distributions are too big for a column). The student trains data-parallel with the
soft-target loss."""

from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from ray.data import TaskPoolStrategy

from scaleforge import storage
from scaleforge.compress.steps.distill import DistillStep
from scaleforge.config.compress import CompressJobConfig
from scaleforge.config.schema import ArtifactSpec, TrainJobConfig
from scaleforge.data.ray_datasets import TrainingData, build_ray_datasets
from scaleforge.train import run_training
from scaleforge.train.hooks import Distillation, TokenDistillation
from scaleforge.train.hooks.distill import cached_teacher


def _teacher_logits(batch: dict[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
    """Ray Data batch function: append the teacher's logits to each batch."""
    torch.set_num_threads(1)
    with torch.inference_mode():
        inputs = torch.from_numpy(np.array(batch["x"], dtype=np.float32))  # Arrow buffers are read-only
        batch["teacher_logits"] = cached_teacher(path)(inputs).float().numpy()
    return batch


def with_teacher_logits(data: TrainingData, teacher: str | Path) -> TrainingData:
    """``data`` whose train split carries a ``teacher_logits`` column, computed once and materialized.

    A task (not an actor pool): the teacher is small and cached per worker process, and a task has
    no restartable constructor arguments for Ray to keep."""
    train = (
        data.datasets["train"]
        .map_batches(
            _teacher_logits,
            fn_kwargs={"path": str(teacher)},
            compute=TaskPoolStrategy(size=1),
            batch_size=1024,
            batch_format="numpy",
        )
        .materialize()
    )
    return replace(data, datasets={**data.datasets, "train": train})


def distill(
    step: DistillStep, teacher: str | Path, cfg: CompressJobConfig, folder: str
) -> dict[str, Optional[Path]]:
    """Train ``step.student`` on the teacher's soft targets (and, if asked, the hard-label baseline).

    Returns:
        ``{"student": artifact, "hard_labels": artifact or None}``; both runs use the same data,
        epochs and seed, so the only difference is the loss.
    """
    plain = build_ray_datasets(cfg.data)

    def train(target: str, data: TrainingData, *hooks: Distillation) -> Path:
        job = TrainJobConfig(
            data=cfg.data,
            model=step.student,
            optim=step.optim,
            scaling=cfg.scaling,
            run=cfg.run.model_copy(update={"name": None}),
            artifact=ArtifactSpec(dir=str(target)),
        )
        return run_training(job, data=data, hooks=hooks).artifact

    if plain.info.tokens:
        student = train(folder, plain, TokenDistillation(step.temperature, step.alpha, str(teacher)))
    else:
        student = train(
            folder, with_teacher_logits(plain, teacher), Distillation(step.temperature, step.alpha)
        )
    baseline = None
    if step.compare_hard_labels:
        baseline = train(storage.with_suffix(folder, "-hard-labels"), plain)
    return {"student": student, "hard_labels": baseline}
