"""Sweeps: one step applied to the teacher at several settings, each setting a parallel Ray task."""

import logging
from dataclasses import dataclass

import ray
import torch
from pydantic import TypeAdapter

from scaleforge import storage
from scaleforge.artifacts import load_artifact
from scaleforge.compress.recipe import save_model_state, teacher_data, teacher_state
from scaleforge.compress.steps import StepArtifact, apply_step
from scaleforge.config.compress import CompressJobConfig, Step
from scaleforge.config.data import TrainDataSpec
from scaleforge.data import localized

_STEP, _DATA = TypeAdapter(Step), TypeAdapter(TrainDataSpec)
_log = logging.getLogger(__name__)


@dataclass
class SweepPoint:
    """One launched sweep setting: its label in the report, the step, its artifact and its Ray task."""

    label: str
    step: str
    target: str
    task: ray.ObjectRef


@ray.remote(num_cpus=1)
def _sweep_point(step_json: dict, teacher_path: str, data_json: dict, target: str) -> dict:
    """One sweep setting, in its own Ray task: the step applied to the teacher, saved as an artifact."""
    torch.set_num_threads(1)
    step, teacher = _STEP.validate_python(step_json), load_artifact(teacher_path)
    data = teacher_data(_DATA.validate_python(data_json), teacher.manifest)
    state, details = apply_step(step, teacher_state(teacher), data)
    save_model_state(target, state, teacher.manifest, data, {"step": step_json, **details})
    return details


def launch_sweeps(cfg: CompressJobConfig, teacher: str, folder: str) -> dict[str, list[SweepPoint]]:
    """Start every sweep setting of ``cfg`` as a Ray task writing under ``folder/<sweep>-<value>``."""
    data_json = localized(cfg.data).model_dump(mode="json")
    tasks = {}
    for sweep in cfg.sweeps:
        tasks[sweep.name] = []
        for value, step in zip(sweep.values, sweep.steps()):
            target = storage.join(folder, f"{sweep.name}-{value}")
            ref = _sweep_point.remote(step.model_dump(mode="json"), teacher, data_json, target)
            tasks[sweep.name].append(
                SweepPoint(f"{sweep.name} {sweep.param}={value}", step.step, target, ref)
            )
    return tasks


def gather_sweeps(tasks: dict[str, list[SweepPoint]]) -> dict[str, list[StepArtifact]]:
    """Wait for every sweep point, in order, logging progress."""
    total = sum(len(points) for points in tasks.values())
    done, results = 0, {}
    for name, points in tasks.items():
        results[name] = []
        for point in points:
            results[name].append(StepArtifact(point.label, point.step, point.target, ray.get(point.task)))
            done += 1
            _log.warning(f"[compress] sweep point {done}/{total} done: {point.label}")
    return results
