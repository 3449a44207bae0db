"""What every stage of the main job is: a name from ``STAGES``, a record type, and ``run``."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, TypeVar

from pydantic import BaseModel

from scaleforge.config.loader import load_config
from scaleforge.config.pipeline import PipelineJobConfig, Stage, StageSpec
from scaleforge.pipeline.records import StageRecord

M = TypeVar("M", bound=BaseModel)


@dataclass
class StageContext:
    """What a stage sees: the job's config, its output folder, and the records of the stages before it."""

    cfg: PipelineJobConfig
    """The job's config: the subclass of its ``kind``, whose stage sections its stages read."""
    out: str
    records: BaseModel
    """The records of its kind (:class:`scaleforge.pipeline.records.Records` for the classifier's)."""
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
    """False for stages that run again in every run that includes them (the query's measurements); their
    record is reused only by a run that starts after them (``--from report`` reuses the query's)."""
    uses_ray: ClassVar[bool] = True
    """False for a stage that runs without Ray (a run of only such stages starts none)."""
    needs_running: ClassVar[tuple[Stage, ...]] = ()
    """Earlier stages whose running service this stage uses: their records are checked (``stale``) only
    when this stage runs."""
    outlives_run: ClassVar[bool] = False
    """What ``run`` started keeps running when the run stops right after this stage (``--to``)."""

    @classmethod
    def stale(cls, record: StageRecord) -> Optional[str]:
        """Why a recorded ``record`` cannot be reused any more (None: reuse it); asked only when a stage
        that ``needs_running`` this one runs."""
        return None

    @abstractmethod
    def run(self, ctx: StageContext) -> StageRecord:
        """Do the stage's work; its record says where the artifacts are and what it measured."""

    def close(self) -> None:  # noqa: B027 (most stages start nothing that outlives ``run``)
        """Free what ``run`` started and that must not outlive the pipeline; called even when a stage
        failed."""
