"""The main job's training stages: teacher, async_sgd, compress, moe and calibrate.

Each is run with its own job's config (``configs/pipeline.yaml`` names the file and its
overrides) and the paths of this run forced in; each returns its typed record.
"""

import json
from pathlib import Path
from typing import Any, Union

from scaleforge.artifacts import read_manifest
from scaleforge.config import (
    AsyncSGDConfig,
    CalibrateConfig,
    CompressJobConfig,
    ServeConfig,
    TrainJobConfig,
    load_config,
)
from scaleforge.config.pipeline import StageSpec
from scaleforge.config.routers import MoEEntry
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records import (
    AsyncRun,
    AsyncSGDRecord,
    CalibrateRecord,
    CompressRecord,
    MoEParts,
    MoERecord,
    TrainRecord,
)
from scaleforge.pipeline.serve import write_serve_yaml
from scaleforge.storage import join


class TeacherStage(PipelineStage):
    """The teacher: data-parallel training on Ray Train."""

    name = "teacher"
    record = TrainRecord

    def run(self, ctx: StageContext) -> TrainRecord:
        return _train(ctx, ctx.cfg.teacher, "teacher")


class AsyncSGDStage(PipelineStage):
    """A parameter-server model, once per consistency mode (sync against async)."""

    name = "async_sgd"
    record = AsyncSGDRecord

    def run(self, ctx: StageContext) -> AsyncSGDRecord:
        from scaleforge.paramserver import run_async_sgd
        from scaleforge.paramserver.preflight import check_runnable

        runs = {}
        for mode in ctx.cfg.async_sgd.modes:
            cfg = ctx.stage_config(
                AsyncSGDConfig,
                ctx.cfg.async_sgd,
                f"server.mode={mode}",
                f"run.output_dir={join(ctx.out, 'async_sgd')}",
                f"artifact.dir={join(ctx.out, 'artifacts', f'async_{mode}')}",
                preflight=check_runnable,
            )
            result = run_async_sgd(cfg)
            runs[mode] = AsyncRun(
                test_accuracy=result.test_accuracy,
                updates=result.updates,
                wall_s=result.wall_s,
                curve=_plain(result.curve),
                artifact=str(result.artifact),
                plot=str(result.plot_path),
            )
        return AsyncSGDRecord(runs=runs)


class CompressStage(PipelineStage):
    """The teacher compressed by the recipe (distil, prune, quantize): the cascade's student."""

    name = "compress"
    record = CompressRecord

    def run(self, ctx: StageContext) -> CompressRecord:
        from scaleforge.compress.preflight import check_runnable
        from scaleforge.compress.run import run_compression

        cfg = ctx.stage_config(
            CompressJobConfig,
            ctx.cfg.compress,
            f"teacher={ctx.records.teacher.artifact}",
            f"output={join(ctx.out, 'artifacts', 'compressed')}",
            f"run.storage_path={join(ctx.out, 'runs')}",
            preflight=check_runnable,
        )
        result = run_compression(cfg)
        return CompressRecord(
            artifact=str(result.artifact), output=str(result.output), report=_plain(result.report)
        )


class MoEStage(PipelineStage):
    """A one-block MoE model, its gate and experts exported for the MoE router."""

    name = "moe"
    record = MoERecord

    def run(self, ctx: StageContext) -> MoERecord:
        trained = _train(ctx, ctx.cfg.moe, "moe")
        manifest = read_manifest(trained.artifact)
        if "moe_parts" not in manifest:
            raise ValueError(
                "the moe stage must train a one-block `moe` model, whose gate and experts are exported"
            )
        return MoERecord(**trained.model_dump(), parts=MoEParts.model_validate(manifest["moe_parts"]))


class CalibrateStage(PipelineStage):
    """The Serve config for this run's artifacts, with the cascade's thresholds calibrated on validation
    data."""

    name = "calibrate"
    record = CalibrateRecord

    def run(self, ctx: StageContext) -> CalibrateRecord:
        from scaleforge.routing.calibration import calibrate_cascade, check_runnable

        serve_config = write_serve_config(ctx)
        cfg = ctx.stage_config(
            CalibrateConfig, ctx.cfg.calibrate, f"serve_config={serve_config}", preflight=check_runnable
        )
        result = calibrate_cascade(cfg)
        return CalibrateRecord(
            serve_config=str(serve_config),
            data=cfg.data,
            thresholds=result.thresholds,
            calibration_fraction=cfg.calibration_fraction,
            split_seed=cfg.split_seed,
            answered_per_stage=result.answered_per_stage,
            accuracy=result.accuracy,
            last_stage_accuracy=result.last_stage_accuracy,
            held_out=result.held_out,
        )


def _train(ctx: StageContext, spec: StageSpec, stage: str) -> TrainRecord:
    from scaleforge.train import run_training
    from scaleforge.train.preflight import check_runnable

    cfg = ctx.stage_config(
        TrainJobConfig,
        spec,
        f"artifact.dir={join(ctx.out, 'artifacts', stage)}",
        f"run.storage_path={join(ctx.out, 'runs')}",
        preflight=check_runnable,
    )
    result = run_training(cfg)
    return TrainRecord(
        artifact=str(result.artifact),
        metrics=_plain(result.metrics),
        history=_plain(result.history),
        parameters=result.num_parameters,
    )


def write_serve_config(ctx: StageContext) -> Union[Path, str]:
    """Write ``serve.yaml`` into the output folder: ``serve.config`` (with ``serve.set``), its models
    pointed at this run's artifacts and its MoE routers at this run's experts.

    Returns:
        The path written.

    Raises:
        ValueError: ``serve.config`` has no model entry for one of this run's artifacts.
    """
    spec, records = ctx.cfg.serve, ctx.records
    cfg = load_config(ServeConfig, spec.config, spec.set)
    experts = records.moe.parts.experts
    produced = {
        "teacher": records.teacher.artifact,
        "student": records.compress.artifact,
        "moe-gate": records.moe.parts.gate,
        **{f"moe-expert-{i}": path for i, path in enumerate(experts)},
    }
    app = cfg.applications[0]
    models = [
        m.model_copy(update={"artifact": produced[m.name]}) for m in app.args.models if m.name in produced
    ]
    missing = set(produced) - {m.name for m in models}
    if missing:
        raise ValueError(
            f"{spec.config}: no model entries named {sorted(missing)} to serve this run's artifacts under"
        )
    routers = [
        r.model_copy(update={"experts": [f"moe-expert-{i}" for i in range(len(experts))]})
        if isinstance(r, MoEEntry)
        else r
        for r in app.args.routers
    ]
    args = app.args.model_copy(update={"models": models, "routers": routers})
    cfg = cfg.model_copy(
        update={"applications": [app.model_copy(update={"args": args}), *cfg.applications[1:]]}
    )
    return write_serve_yaml(
        join(ctx.out, "serve.yaml"), cfg, f"# ray serve config written by jobs.pipeline from {spec.config}\n"
    )


def _plain(value: Any) -> Any:
    """JSON-ready copy (numpy scalars and paths become plain values)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
