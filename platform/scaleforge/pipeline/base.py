"""What every stage of the main job is: a name from ``STAGES``, a record type, and ``run``."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, TypeVar

from pydantic import BaseModel

from scaleforge.config.loader import load_config
from scaleforge.config.pipeline import PipelineConfig, Stage, StageSpec
from scaleforge.pipeline.records import Records, StageRecord

M = TypeVar("M", bound=BaseModel)


@dataclass
class StageContext:
    """What a stage sees: the job's config, its output folder, and the records of the stages before it."""

    cfg: PipelineConfig
    out: str
    records: Records
    log: Callable[[str], None]
    started: float
    """``time.perf_counter()`` when the pipeline started."""

    def stage_config(self, schema: type[M], spec: StageSpec, *forced: str, preflight=None) -> M:
        """The stage's own job config: its file, its ``set`` overrides, then ``forced`` ones (paths of
        this run), pre-flighted as its own job would be."""
        return load_config(schema, spec.config, [*spec.set, *forced], preflight)


class PipelineStage(ABC):
    """One stage. ``run`` returns its record; the pipeline times it, writes it to ``records/<name>.json``
    and, for a ``reusable`` stage, reuses it in later runs instead of running the stage again."""

    name: ClassVar[Stage]
    record: ClassVar[type[StageRecord]]
    reusable: ClassVar[bool] = True
    """False for stages whose effect does not outlive the run (the query's measurements)."""
    outlives_run: ClassVar[bool] = False
    """What ``run`` started keeps running when the run stops right after this stage (``--to``)."""

    @classmethod
    def stale(cls, record: StageRecord) -> Optional[str]:
        """Why a recorded ``record`` cannot be reused any more (None: reuse it)."""
        return None

    @abstractmethod
    def run(self, ctx: StageContext) -> StageRecord:
        """Do the stage's work; its record says where the artifacts are and what it measured."""

    def close(self) -> None:
        """Free what ``run`` started and that must not outlive the pipeline; called even when a stage failed."""
