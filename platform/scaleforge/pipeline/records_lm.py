"""What each stage of the main job on text (``kind: lm``) recorded; the teacher, compress, serve and
report stages record what the classifier's do (:mod:`scaleforge.pipeline.records`)."""

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from scaleforge.calibrate.drafts import DraftPoint, LoadPoint
from scaleforge.pipeline.records import CompressRecord, ReportRecord, ServeRecord, StageRecord, TrainRecord


class DraftRecord(StageRecord):
    """The draft length of one generator, chosen by timing each candidate on held-out prompts over this
    run's artifacts (:func:`scaleforge.calibrate.drafts.calibrate_drafts`); the serve stage serves it."""

    generator: str
    model: str
    """The served model the generator decodes."""
    drafter: str
    """The drafter's served model, or ``lookup``."""
    points: list[DraftPoint] = Field(min_length=1)
    chosen: int
    loads: list[LoadPoint]
    draft_max_running: Optional[int]


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GeneratorLoad(_Row):
    """One load on one generator: ``clients`` streaming clients sending the prompts."""

    clients: int
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    first_token_p50_ms: float
    """Time to the first streamed token, from sending the request (HTTP included)."""
    first_token_p99_ms: float
    acceptance: Optional[float] = None
    """Drafted tokens the model kept, over every ingress replica (None: nothing drafted, or the replicas'
    own URLs unknown, so their counters were not read)."""
    rows_per_step: Optional[float] = None
    """Sequences per decode step, on average: continuous batching at work."""
    largest_step: Optional[int] = None


class GeneratorResult(_Row):
    """A served generator under each load."""

    model: str
    """The served model it decodes."""
    artifact: str
    """That model's artifact."""
    loads: list[GeneratorLoad] = Field(min_length=1)


class Sample(_Row):
    prompt: str
    completion: str


class TextQueryRecord(StageRecord):
    """Held-out prompts sent to every served generator over HTTP, streaming."""

    url: str
    direct: bool
    """Whether the requests went to the ingress replicas' own ports, not Serve's proxy."""
    prompt_bytes: int
    max_tokens: int
    generators: dict[str, GeneratorResult]
    samples: list[Sample]
    """The calibrated generator's greedy completions of the first prompts."""
    pipeline_wall_s: float


class LMRecords(BaseModel):
    """Every stage's record of ``kind: lm``, by stage name; a stage not yet run or reused has none."""

    model_config = ConfigDict(extra="forbid")

    teacher: Optional[TrainRecord] = None
    compress: Optional[CompressRecord] = None
    calibrate: Optional[DraftRecord] = None
    serve: Optional[ServeRecord] = None
    query: Optional[TextQueryRecord] = None
    report: Optional[ReportRecord] = None
