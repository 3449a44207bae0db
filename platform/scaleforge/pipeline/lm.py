"""The main job on text (``kind: lm``): its calibrate and serve stages, and its stages in order.

The teacher and compress stages are the classifier's (each runs its own job's config); the calibrate
stage times draft lengths over this run's artifacts; the serve stage serves ``serve.config``'s
generators over them with the calibrated length; the query and report stages are in
:mod:`scaleforge.pipeline.text_query` and :mod:`scaleforge.pipeline.report_lm`.
"""

from scaleforge.config import CalibrateConfig, ServeConfig, load_config
from scaleforge.config.pipeline_lm import GeneratorServeSpec
from scaleforge.config.serve import ServeArgs
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records import Placement
from scaleforge.pipeline.records_lm import DraftRecord, LMRecords
from scaleforge.pipeline.report_lm import LMReportStage
from scaleforge.pipeline.serve import ServeStage
from scaleforge.pipeline.serve_plan import serving
from scaleforge.pipeline.stages import CompressStage, TeacherStage
from scaleforge.pipeline.text_query import TextQueryStage
from scaleforge.routers import GeneratorEntry, RouterEntry
from scaleforge.storage import join


def lm_artifact(records: LMRecords, source: str) -> str:
    """The artifact of this run that ``source`` (a value of ``serve.models``) names."""
    stage, _, folder = source.partition("/")
    if stage == "teacher":
        return records.teacher.artifact
    return join(records.compress.output, folder) if folder else records.compress.artifact


def generator_serve_args(template: ServeArgs, spec: GeneratorServeSpec, records: LMRecords) -> ServeArgs:
    """``template`` serving this run's artifacts: the model entries named in ``spec.models`` pointed at
    them, the routers over those models only, and the calibrated generator's draft length (once the
    calibrate stage has run).

    Raises:
        ValueError: ``serve.config`` has no model entry for a name in ``spec.models``.
    """
    artifacts = {name: lm_artifact(records, source) for name, source in spec.models.items()}
    missing = sorted(set(artifacts) - {m.name for m in template.models})
    if missing:
        raise ValueError(
            f"{spec.config}: no model entries named {missing} to serve this run's artifacts under"
        )
    routers = routers_over(template, set(artifacts))
    calibrated = records.calibrate
    if calibrated is not None:
        drafts = {"draft_tokens": calibrated.chosen, "draft_max_running": calibrated.draft_max_running}
        routers = [r.model_copy(update=drafts) if r.name == calibrated.generator else r for r in routers]
    return serving(template, artifacts, routers)


def routers_over(template: ServeArgs, models: set[str]) -> list[RouterEntry]:
    """``template``'s routers whose every model is among ``models`` (the others are not served)."""
    return [router for router in template.routers if set(router.models()) <= models]


def calibrated_generator(cfg: CalibrateConfig, args: ServeArgs, where: str) -> GeneratorEntry:
    """The generator whose draft length the calibrate stage chooses: ``cfg.generator`` (default the first
    with a drafter) among ``args``'s served ones.

    Raises:
        ValueError: no such generator, or it has no drafter.
    """
    generators = args.routers_of(GeneratorEntry)
    names = [g.name for g in generators]
    drafted = [g for g in generators if g.drafter is not None]
    if cfg.generator is None and not drafted:
        raise ValueError(f"{where}: no served generator has a drafter, so no draft length to calibrate")
    chosen = next((g for g in generators if g.name == cfg.generator), None) if cfg.generator else drafted[0]
    if chosen is None:
        raise ValueError(
            f"generator: {cfg.generator!r} is not served by {where} (generators: {', '.join(names)})"
        )
    if chosen.drafter is None:
        raise ValueError(
            f"generator: {chosen.name!r} in {where} has no drafter, so no draft length to calibrate"
        )
    return chosen


class DraftCalibrateStage(PipelineStage):
    """The draft length of ``calibrate.config``'s generator, timed on held-out prompts over this run's
    artifacts (its ``draft`` search); the serve stage serves it."""

    name = "calibrate"
    record = DraftRecord
    uses_ray = False

    def run(self, ctx: StageContext) -> DraftRecord:
        from scaleforge.calibrate.drafts import calibrate_drafts
        from scaleforge.routers.generator import LOOKUP

        spec = ctx.cfg.serve
        calibrate = ctx.stage_config(CalibrateConfig, ctx.cfg.calibrate)
        template = load_config(ServeConfig, spec.config, spec.set).applications[0].args
        args = generator_serve_args(template, spec, ctx.records)
        generator = calibrated_generator(calibrate, args, spec.config)
        drafter = LOOKUP if generator.drafter == LOOKUP else args.model(generator.drafter).artifact
        calibration = calibrate_drafts(args.model(generator.model).artifact, drafter, calibrate.draft)
        ctx.log(f"[calibrate] generator {generator.name!r}:\n{calibration.summary()}")
        return DraftRecord(
            generator=generator.name,
            model=generator.model,
            drafter=generator.drafter,
            points=calibration.points,
            chosen=calibration.chosen,
            loads=calibration.loads,
            draft_max_running=calibration.draft_max_running,
        )


class GeneratorServeStage(ServeStage):
    """``serve.config``'s generators over this run's artifacts, the calibrated draft length in its
    generator; the models run inside the ingress replicas, so there is nothing to place."""

    def plan(self, ctx: StageContext, template: ServeArgs) -> tuple[ServeArgs, Placement]:
        return generator_serve_args(template, ctx.cfg.serve, ctx.records), Placement(enabled=False)


LM_PIPELINE: tuple[type[PipelineStage], ...] = (
    TeacherStage,
    CompressStage,
    DraftCalibrateStage,
    GeneratorServeStage,
    TextQueryStage,
    LMReportStage,
)
"""The stage classes of ``kind: lm``, in the order they run."""
