"""The main job's training stages: teacher, async_sgd, compress, moe and calibrate.

Each is run with its own job's config (``configs/pipeline.yaml`` names the file and its
overrides) and the paths of this run forced in; each returns its typed record.
"""

import json
from typing import Any

from scaleforge.artifacts import read_manifest
from scaleforge.config import AsyncSGDConfig, CalibrateConfig, CompressJobConfig, TrainJobConfig
from scaleforge.config.pipeline import StageSpec
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
from scaleforge.pipeline.serve_plan import served_artifact
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
    """The cascade's thresholds, calibrated on validation data (``calibrate.config``'s data and target)
    over this run's artifacts of ``serve.cascade.stages``; they go into the record, not a file."""

    name = "calibrate"
    record = CalibrateRecord

    def run(self, ctx: StageContext) -> CalibrateRecord:
        from scaleforge.calibrate import calibrate_cascade

        spec = ctx.stage_config(CalibrateConfig, ctx.cfg.calibrate, preflight=_check_data)
        cascade = ctx.cfg.serve.cascade
        artifacts = [served_artifact(ctx.cfg.serve, ctx.records, name) for name in cascade.stages]
        calibration = calibrate_cascade(artifacts, cascade.measure, spec)
        ctx.log(f"[calibrate] {cascade.name}: thresholds {calibration.thresholds}; {calibration.summary()}")
        return CalibrateRecord(
            **calibration.model_dump(),
            cascade=cascade.name,
            stages=cascade.stages,
            data=spec.data,
            calibration_fraction=spec.calibration_fraction,
            split_seed=spec.split_seed,
        )


def _check_data(cfg: CalibrateConfig) -> None:
    from scaleforge.data.preflight import check_files

    check_files(cfg.data)


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


def _plain(value: Any) -> Any:
    """JSON-ready copy (numpy scalars and paths become plain values)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
