"""Knowledge distillation on Ray Train: the teacher's logits are computed once with Ray Data and
ride along as a dataset column; the student trains data-parallel with the soft-target loss."""

from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from scaleforge.config.compress import CompressJobConfig, DistillStep
from scaleforge.config.schema import ArtifactSpec, TrainJobConfig
from scaleforge.data.ray_datasets import TrainingData, build_ray_datasets
from scaleforge.distributed.dp import run_training
from scaleforge.train.preflight import check_runnable


class _TeacherLogits:
    """Ray Data callable class: loads the teacher once per actor and appends its logits to each batch."""

    def __init__(self, path: str):
        from scaleforge.artifacts import load_model

        torch.set_num_threads(1)
        self.model = load_model(path)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            inputs = torch.from_numpy(np.array(batch["x"], dtype=np.float32))  # Arrow buffers are read-only
            batch["teacher_logits"] = self.model(inputs).float().numpy()
        return batch


def with_teacher_logits(data: TrainingData, teacher: str | Path) -> TrainingData:
    """``data`` whose train split carries a ``teacher_logits`` column, computed once and materialized."""
    train = data.datasets["train"].map_batches(_TeacherLogits, fn_constructor_kwargs={"path": str(teacher)},
                                               concurrency=1, batch_size=1024, batch_format="numpy").materialize()
    return replace(data, datasets={**data.datasets, "train": train})


def distill(step: DistillStep, teacher: str | Path, cfg: CompressJobConfig, folder: Path) -> dict[str, Optional[Path]]:
    """Train ``step.student`` on the teacher's soft targets (and, if asked, the hard-label baseline).

    Returns:
        ``{"student": artifact, "hard_labels": artifact or None}``; both runs use the same data,
        epochs and seed, so the only difference is the loss.
    """
    plain = build_ray_datasets(cfg.data)

    def train(target: Path, data: TrainingData, soft: Optional[dict[str, float]]) -> Path:
        job = TrainJobConfig(data=cfg.data, model=step.student, optim=step.optim, scaling=cfg.scaling,
                             run=cfg.run.model_copy(update={"name": None}), artifact=ArtifactSpec(dir=str(target)))
        check_runnable(job)  # e.g. more workers than a small dataset has examples
        return run_training(job, data=data, distill=soft).artifact

    soft = {"temperature": step.temperature, "alpha": step.alpha}
    student = train(folder, with_teacher_logits(plain, teacher), soft)
    baseline = None
    if step.compare_hard_labels:
        baseline = train(folder.with_name(folder.name + "-hard-labels"), plain, None)
    return {"student": student, "hard_labels": baseline}
