"""The compression job: run the recipe chain, the sweeps (parallel Ray tasks), measure, report.

Every model that is reported is measured the same way, in the driver, one after another: loaded
from its artifact through ``scaleforge.artifacts.load_model`` (the loader serving uses), then
its quality on the held-out split (a classifier's accuracy, a language model's bits per byte),
bytes on disk and CPU latency with the same thread count. Ratios against the teacher come from
the same run, so the noise of a shared machine cancels as far as it can.
"""

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import ray
import torch
from pydantic import TypeAdapter

from scaleforge import storage
from scaleforge.artifacts import load_artifact, load_model, read_manifest, save_artifact
from scaleforge.compress.distill import distill
from scaleforge.compress.measure import StepRecord, example_input, folder_bytes, latency_table
from scaleforge.compress.report import slim_sentence, write_report
from scaleforge.compress.steps import ModelState, apply_step
from scaleforge.config.compress import CompressJobConfig, Step
from scaleforge.config.data import TrainDataSpec
from scaleforge.data import localized
from scaleforge.data.in_memory import InMemoryData, load_in_memory
from scaleforge.models import MODEL_SPEC
from scaleforge.runtime import ensure_ray

_STEP, _DATA = TypeAdapter(Step), TypeAdapter(TrainDataSpec)
_log = logging.getLogger(__name__)


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
    data = load_in_memory(cfg.data)
    if teacher.manifest.get("dataset", {}).get("fingerprint") not in (None, data.fingerprint):
        raise ValueError(
            f"data: {cfg.data.source} differs from the data the teacher was trained on "
            f"(fingerprint {teacher.manifest['dataset']['fingerprint'][:19]}...)"
        )
    ensure_ray(min_cpus=cfg.scaling.num_workers * cfg.scaling.resources_per_worker.get("CPU", 1) + 2)
    chain = _run_recipe(cfg, teacher, data, storage.join(out, "steps"))
    # After the recipe: Ray Train's workers for distillation would otherwise queue behind sweep tasks.
    sweeps = _gather_sweeps(_launch_sweeps(cfg, teacher_path, storage.join(out, "sweeps")))

    entries = [("teacher", "teacher", teacher_path, {}), *chain]
    entries += [point for points in sweeps.values() for point in points]
    records = _measure(entries, data, cfg)
    measured = {"teacher": records[0], "recipe": records[1 : len(chain) + 1], "sweeps": {}}
    remaining = iter(records[len(chain) + 1 :])
    for name, points in sweeps.items():
        measured["sweeps"][name] = [next(remaining) for _ in points]
    final = _save_slim_model(storage.join(out, "model"), chain[-1][2])
    report = write_report(out, measured, cfg, wall_s=time.perf_counter() - started)
    return CompressionResult(final, report, out, time.perf_counter() - started)


def _run_recipe(
    cfg: CompressJobConfig, teacher, data: InMemoryData, folder: str
) -> list[tuple[str, str, str, dict]]:
    """Each recipe step starts from the previous step's model; every step's output is an artifact."""
    state = ModelState(
        teacher.model,
        MODEL_SPEC.validate_python(teacher.manifest["model"]),
        list(teacher.manifest.get("architecture", [])),
    )
    current, chain = teacher.path, []
    for index, step in enumerate(cfg.recipe):
        name = f"{index:02d}-{step.step}"
        target = storage.join(folder, name)
        _log.warning(f"[compress] step {index + 1}/{len(cfg.recipe)}: {step.step}")
        if step.step == "distill":
            trained = distill(step, current, cfg, target)
            student = load_artifact(trained["student"])
            state = ModelState(student.model, step.student, [])
            if trained["hard_labels"]:
                chain.append(
                    (
                        f"{index:02d}-distill-hard-labels",
                        "distill_baseline",
                        trained["hard_labels"],
                        {"temperature": step.temperature, "alpha": 0.0},
                    )
                )
            chain.append(
                (name, "distill", trained["student"], {"temperature": step.temperature, "alpha": step.alpha})
            )
            current = trained["student"]
            continue
        if step.step == "export":
            current = _save(target, state, teacher.manifest, data, {"step": "export"})
            if step.onnx:
                export_onnx(state.model, storage.join(target, "model.onnx"), data.info.input_dim, data.vocab)
            chain.append((name, "export", current, {"onnx": step.onnx}))
            continue
        state, details = apply_step(step, state, data)
        current = _save(
            target, state, teacher.manifest, data, {"step": step.model_dump(mode="json"), **details}
        )
        chain.append((name, step.step, current, details))
    return chain


@ray.remote(num_cpus=1)
def _sweep_point(step_json: dict, teacher_path: str, data_json: dict, target: str) -> dict:
    """One sweep setting, in its own Ray task: the step applied to the teacher, saved as an artifact."""
    torch.set_num_threads(1)
    step, teacher = _STEP.validate_python(step_json), load_artifact(teacher_path)
    data = load_in_memory(_DATA.validate_python(data_json))
    state = ModelState(
        teacher.model,
        MODEL_SPEC.validate_python(teacher.manifest["model"]),
        list(teacher.manifest.get("architecture", [])),
    )
    state, details = apply_step(step, state, data)
    _save(target, state, teacher.manifest, data, {"step": step_json, **details})
    return details


def _launch_sweeps(cfg: CompressJobConfig, teacher: str, folder: str) -> dict[str, list]:
    tasks = {}
    for sweep in cfg.sweeps:
        tasks[sweep.name] = []
        for value, step in zip(sweep.values, sweep.steps()):
            target = storage.join(folder, f"{sweep.name}-{value}")
            ref = _sweep_point.remote(
                step.model_dump(mode="json"), teacher, localized(cfg.data).model_dump(mode="json"), target
            )
            tasks[sweep.name].append((f"{sweep.name} {sweep.param}={value}", step.step, target, ref))
    return tasks


def _gather_sweeps(tasks: dict[str, list]) -> dict[str, list]:
    total = sum(len(points) for points in tasks.values())
    done, results = 0, {}
    for name, points in tasks.items():
        results[name] = []
        for label, step, target, ref in points:
            results[name].append((label, step, target, ray.get(ref)))
            done += 1
            _log.warning(f"[compress] sweep point {done}/{total} done: {label}")
    return results


def _measure(
    entries: list[tuple[str, str, str, dict]], data: InMemoryData, cfg: CompressJobConfig
) -> list[StepRecord]:
    """Every model loaded through the serving loader, then timed side by side (round-robin)."""
    models = {name: load_model(path) for name, _, path, _ in entries}
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
            name=name,
            step=step,
            artifact=str(path),
            parameters=read_manifest(path)["parameters"],
            bytes=folder_bytes(path),
            metric=data.metric,
            score=data.score(models[name]),
            latency_ms=latency[name],
            details=details,
        )
        for name, step, path, details in entries
    ]


def _save(
    target: str, state: ModelState, teacher_manifest: dict, data: InMemoryData, compression: dict
) -> Path:
    return save_artifact(
        target,
        state.model,
        state.spec,
        input_dim=data.info.input_dim,
        num_classes=data.info.num_classes,
        metrics=data.metrics(state.model),
        dataset=teacher_manifest.get("dataset"),
        architecture=state.edits or None,
        extra={"compression": compression, **_tokenizer(teacher_manifest)},
    )


def _tokenizer(manifest: dict) -> dict:
    """A language model's tokenizer entry, carried from artifact to artifact as the trainer writes it."""
    return {"tokenizer": manifest["tokenizer"]} if "tokenizer" in manifest else {}


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
        extra={"compression": manifest.get("compression", {}), "source": str(source), **_tokenizer(manifest)},
    )


def export_onnx(model: torch.nn.Module, path: str, input_dim: int, vocab: Optional[int] = None) -> None:
    """``model`` as ONNX (dynamic batch) for edge runtimes such as onnxruntime, at a path or a URI;
    with ``vocab``, a language model taking windows of ``input_dim`` token ids."""
    with tempfile.TemporaryDirectory(prefix="scaleforge-onnx-") as staging:
        local = Path(staging) / "model.onnx"
        torch.onnx.export(
            model.eval(),
            (example_input(1, input_dim, vocab),),
            str(local),
            input_names=["x"],
            output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
        storage.upload(local, path)
