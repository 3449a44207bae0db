"""The main job's stages chained through one output folder, each reusing its record when one exists.

A stage's record (``records/<stage>.json``, written atomically after the stage succeeded) says
where its artifacts are and what it measured; a later run reuses every recorded stage before
``redo_from``. A stage that fails writes no record, and earlier records and artifacts stay as
they were. Records to reuse are read and validated when the :class:`Pipeline` is made, before
any stage (or Ray) starts.
"""

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pydantic import BaseModel, ValidationError

from scaleforge import storage
from scaleforge.config.pipeline import STAGES, PipelineJobConfig, Stage
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.lm import LM_PIPELINE
from scaleforge.pipeline.query import QueryStage
from scaleforge.pipeline.records import Records, StageRecord
from scaleforge.pipeline.records_lm import LMRecords
from scaleforge.pipeline.report import ReportStage, final_table
from scaleforge.pipeline.report_lm import final_table as lm_final_table
from scaleforge.pipeline.serve import ServeStage
from scaleforge.pipeline.stages import AsyncSGDStage, CalibrateStage, CompressStage, MoEStage, TeacherStage
from scaleforge.storage import write_atomic

PIPELINE: tuple[type[PipelineStage], ...] = (
    TeacherStage,
    AsyncSGDStage,
    CompressStage,
    MoEStage,
    CalibrateStage,
    ServeStage,
    QueryStage,
    ReportStage,
)
"""The classifier's stage classes, in the order they run (``STAGES``)."""


@dataclass(frozen=True)
class PipelineKind:
    """One kind of main job (``kind:`` in its config): its stages in order, the model of its records,
    and the table its run prints at the end."""

    stages: tuple[type[PipelineStage], ...]
    records: type[BaseModel]
    final_table: Callable[[Any], str]

    def __post_init__(self) -> None:
        names = [stage.name for stage in self.stages]
        if names != list(self.records.model_fields) or not set(names) <= set(STAGES):
            raise ImportError(
                f"scaleforge.pipeline: stages {names} and the records' fields "
                f"{list(self.records.model_fields)} must name the same stages, from STAGES"
            )

    @property
    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]


KINDS: dict[str, PipelineKind] = {
    "classifier": PipelineKind(PIPELINE, Records, final_table),
    "lm": PipelineKind(LM_PIPELINE, LMRecords, lm_final_table),
}
"""Each ``kind`` of :class:`scaleforge.config.pipeline.PipelineJobConfig` and what it runs."""


class StageFailed(RuntimeError):
    """A stage raised; the message names it and how to resume."""


class RecordError(ValueError):
    """A record to reuse does not validate (written by another version): names the file and the field."""


class StageOrderError(ValueError):
    """``--to`` names a stage before ``--from``."""


class Pipeline:
    """Runs the stages of ``cfg`` in order; ``redo_from`` redoes that stage and every later one, and
    ``stop_after`` ends the run after that stage (each stage can run as a process of its own).

    Raises:
        RecordError: a record that this run would reuse does not validate.
        StageOrderError: ``stop_after`` comes before ``redo_from``.
    """

    def __init__(
        self,
        cfg: PipelineJobConfig,
        redo_from: Optional[Stage] = None,
        log: Callable[[str], None] = print,
        stop_after: Optional[Stage] = None,
    ):
        self.kind = KINDS[cfg.kind]
        names = self.kind.names
        for option, stage in (("--from", redo_from), ("--to", stop_after)):
            if stage is not None and stage not in names:
                raise StageOrderError(
                    f"{option} {stage}: not a stage of kind {cfg.kind} ({', '.join(names)})"
                )
        if redo_from and stop_after and names.index(stop_after) < names.index(redo_from):
            raise StageOrderError(
                f"--to {stop_after} comes before --from {redo_from} (stages: {', '.join(names)})"
            )
        self.cfg, self.log = cfg, log
        self.out = storage.normalize(cfg.output)
        self.records = self.kind.records()
        self.stages = self.kind.stages[: names.index(stop_after) + 1] if stop_after else self.kind.stages
        kept = self.stages[: names.index(redo_from)] if redo_from else self.stages
        recorded = {
            stage.name: record
            for stage in kept
            if (stage.reusable or redo_from) and (record := self._read_record(stage)) is not None
        }
        # A record that says a service runs (Serve) is checked only where this run uses the service, or
        # leaves it running (``--to serve``); ``--from report`` reuses it as it is.
        running = [stage for stage in self.stages if stage.name not in recorded]
        checked = {name for stage in running for name in stage.needs_running}
        checked |= {self.stages[-1].name} if self.stages[-1].outlives_run else set()
        self._reused = {
            name: record
            for name, record in recorded.items()
            if name not in checked or self._still_running(self.kind.stages[names.index(name)], record)
        }

    @property
    def to_run(self) -> list[type[PipelineStage]]:
        """The stages this run runs (the others reuse their records)."""
        return [stage for stage in self.stages if stage.name not in self._reused]

    def record_path(self, stage: Stage) -> str:
        """``records/<stage>.json`` in the output folder (or under the output URI)."""
        return storage.join(self.out, "records", f"{stage}.json")

    def run(self) -> BaseModel:
        """Every stage, reused or run; whatever a stage started is freed at the end, also on failure.

        Raises:
            StageFailed: a stage raised (its record is not written).
        """
        ctx = StageContext(self.cfg, self.out, self.records, self.log, time.perf_counter())
        started: list[PipelineStage] = []
        finished = False
        try:
            for index, stage_class in enumerate(self.stages, start=1):
                name = stage_class.name
                if name in self._reused:
                    setattr(self.records, name, self._reused[name])
                    self.log(
                        f"[pipeline] {index}/{len(self.kind.stages)} {name}: reused "
                        f"({self.record_path(name)})"
                    )
                    continue
                self.log(f"[pipeline] {index}/{len(self.kind.stages)} {name}: running ...")
                stage = stage_class()
                started.append(stage)
                record = self._run_stage(stage, ctx)
                write_atomic(self.record_path(name), record.model_dump_json(indent=2) + "\n")
                setattr(self.records, name, record)
                self.log(f"[pipeline] {name}: done in {record.wall_s:.1f} s")
            finished = True
        finally:
            for stage in reversed(started):
                names = self.kind.names
                if finished and stage.outlives_run and stage is started[-1] and stage.name != names[-1]:
                    self.log(
                        f"[pipeline] {stage.name}: left running for the next run (--from "
                        f"{names[names.index(stage.name) + 1]})"
                    )
                else:
                    stage.close()
        return self.records

    def _run_stage(self, stage: PipelineStage, ctx: StageContext) -> StageRecord:
        began = time.perf_counter()
        try:
            if self.cfg.fault.fail_at_stage == stage.name:
                raise RuntimeError(f"injected failure (fault.fail_at_stage={stage.name})")
            record = stage.run(ctx)
        except Exception as err:
            raise StageFailed(
                f"stage {stage.name} failed: {err}; earlier stages are kept, resume with --from {stage.name}"
            ) from err
        return record.model_copy(update={"wall_s": time.perf_counter() - began})

    def _read_record(self, stage: type[PipelineStage]) -> Optional[StageRecord]:
        path = self.record_path(stage.name)
        if not storage.is_file(path):
            return None
        try:
            record = stage.record.model_validate_json(storage.read_text(path))
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise RecordError(f"{path}: {problems} (redo the stage: --from {stage.name})") from None
        return record

    def _still_running(self, stage: type[PipelineStage], record: StageRecord) -> bool:
        reason = stage.stale(record)
        if reason is not None:
            self.log(f"[pipeline] {stage.name}: not reused, {reason}")
        return reason is None
