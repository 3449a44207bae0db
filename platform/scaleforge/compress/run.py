"""The compression job: run the recipe chain, the sweeps (parallel Ray tasks), measure, report.

Every model that is reported is measured the same way, in the driver, one after another: loaded
from its artifact through ``scaleforge.artifacts.load_model`` (the loader serving uses), then
its quality on the held-out split (a classifier's accuracy, a language model's bits per byte),
bytes on disk and CPU latency with the same thread count. Ratios against the teacher come from
the same run, so the noise of a shared machine cancels as far as it can.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch

from scaleforge import storage
from scaleforge.artifacts import load_artifact, load_model, read_manifest, save_artifact
from scaleforge.compress.measure import StepRecord, folder_bytes, latency_table
from scaleforge.compress.recipe import run_recipe, teacher_data, tokenizer_entry
from scaleforge.compress.report import slim_sentence, write_report
from scaleforge.compress.steps import StepArtifact
from scaleforge.compress.sweeps import gather_sweeps, launch_sweeps
from scaleforge.config.compress import CompressJobConfig
from scaleforge.data.in_memory import InMemoryData
from scaleforge.models import MODEL_SPEC
from scaleforge.runtime import ensure_ray


@dataclass
class CompressionResult:
    """The slim artifact, the report folder and every measured model."""

    artifact: Union[Path, str]
    report: dict[str, Any]
    output: str
    wall_s: float

    def summary(self) -> str:
        return "\n".join(
            [
                f"slim model: {slim_sentence(self.report)}",
                f"artifact: {self.artifact}",
                f"report: {storage.join(self.output, 'report.md')} ({self.wall_s:.1f} s wall-clock)",
            ]
        )


def run_compression(cfg: CompressJobConfig) -> CompressionResult:
    """Compress ``cfg.teacher`` with ``cfg.recipe``, run ``cfg.sweeps``, write artifacts and the report."""
    started = time.perf_counter()
    # One intra-op thread count for everything the driver runs: on a loaded machine extra OpenMP
    # threads spin against other processes (a conv step measured 50x slower with 2 threads than 1).
    torch.set_num_threads(cfg.measure.threads)
    out, teacher_path = storage.normalize(cfg.output), storage.normalize(cfg.teacher)
    teacher = load_artifact(teacher_path)
    data = teacher_data(cfg.data, teacher.manifest)
    if teacher.manifest.get("dataset", {}).get("fingerprint") not in (None, data.fingerprint):
        raise ValueError(
            f"data: {cfg.data.source} differs from the data the teacher was trained on "
            f"(fingerprint {teacher.manifest['dataset']['fingerprint'][:19]}...)"
        )
    ensure_ray(min_cpus=cfg.scaling.num_workers * cfg.scaling.resources_per_worker.get("CPU", 1) + 2)
    chain = run_recipe(cfg.recipe, cfg, teacher, data, storage.join(out, "steps"))
    # After the recipe: Ray Train's workers for distillation would otherwise queue behind sweep tasks.
    sweeps = gather_sweeps(launch_sweeps(cfg, teacher_path, storage.join(out, "sweeps")))

    entries = [StepArtifact("teacher", "teacher", teacher_path), *chain]
    entries += [point for points in sweeps.values() for point in points]
    records = _measure(entries, data, cfg)
    measured = {"teacher": records[0], "recipe": records[1 : len(chain) + 1], "sweeps": {}}
    remaining = iter(records[len(chain) + 1 :])
    for name, points in sweeps.items():
        measured["sweeps"][name] = [next(remaining) for _ in points]
    final = _save_slim_model(storage.join(out, "model"), chain[-1].artifact)
    report = write_report(out, measured, cfg, wall_s=time.perf_counter() - started)
    return CompressionResult(final, report, out, time.perf_counter() - started)


def _measure(entries: list[StepArtifact], data: InMemoryData, cfg: CompressJobConfig) -> list[StepRecord]:
    """Every model loaded through the serving loader, then timed side by side (round-robin)."""
    models = {entry.name: load_model(entry.artifact) for entry in entries}
    latency = latency_table(
        models,
        data.info.input_dim,
        cfg.measure.batch_sizes,
        cfg.measure.repeats,
        cfg.measure.threads,
        vocab=data.vocab,
    )
    return [
        StepRecord(
            name=entry.name,
            step=entry.step,
            artifact=str(entry.artifact),
            parameters=read_manifest(entry.artifact)["parameters"],
            bytes=folder_bytes(entry.artifact),
            metric=data.metric,
            score=data.score(models[entry.name]),
            latency_ms=latency[entry.name],
            details=entry.details,
        )
        for entry in entries
    ]


def _save_slim_model(target: str, source: str):
    """The recipe's last artifact, re-exported (verified on load, written atomically) as ``output/model``."""
    artifact = load_artifact(source)
    manifest = artifact.manifest
    return save_artifact(
        target,
        artifact.model,
        MODEL_SPEC.validate_python(manifest["model"]),
        input_dim=manifest["input_dim"],
        num_classes=manifest["num_classes"],
        metrics=manifest["metrics"],
        dataset=manifest["dataset"],
        architecture=manifest.get("architecture"),
        extra={
            "compression": manifest.get("compression", {}),
            "source": str(source),
            **tokenizer_entry(manifest),
        },
    )
