"""Schema of the main job (``jobs.pipeline``): every stage's own config, chained through one output folder.

The stage configs are files named here, not read here: :func:`scaleforge.pipeline.preflight.check_runnable`
loads and checks them before the first stage starts. ``kind`` picks the pipeline: :class:`PipelineConfig`
(``classifier``, the default) or one of the other subclasses of :class:`PipelineJobConfig`
(``kind: lm``: :class:`scaleforge.config.pipeline_lm.LMPipelineConfig`).
"""

from typing import Any, Literal, Optional, get_args

from pydantic import Field, NonNegativeFloat, PositiveInt, ValidationError, model_validator

from scaleforge.config.schema import _Section
from scaleforge.config.serve import NAME_PATTERN
from scaleforge.config.storage_root import storage_layout

Stage = Literal["teacher", "async_sgd", "compress", "moe", "calibrate", "serve", "query", "report"]
"""The main job's stages, in the order they run: the one list that ``STAGES`` and ``--from`` read."""
STAGES: tuple[Stage, ...] = get_args(Stage)


class StageSpec(_Section):
    """One stage: the config file of its own job, and ``--set``-style overrides of it."""

    config: str
    set: list[str] = Field(default_factory=list)


class AsyncStageSpec(StageSpec):
    modes: list[Literal["sync", "async", "ssp"]] = Field(
        default_factory=lambda: ["sync", "async"], min_length=1
    )
    """One parameter-server run per mode, for the sync-against-async plot."""


class ServedCascade(_Section):
    """The cascade the calibrate stage fits and the serve stage serves."""

    name: str = Field(default="cascade", pattern=NAME_PATTERN)
    """Its name in the URL: ``/v2/models/{name}``."""
    measure: Literal["max_prob", "margin", "entropy"] = "max_prob"
    """Confidence measure (see ``scaleforge.routing.confidence``)."""
    stages: list[str] = Field(default_factory=lambda: ["student", "teacher"], min_length=2)
    """Served model names (keys of ``serve.models``), cheapest first."""


class ServedMoE(_Section):
    """The MoE router that serves the moe stage's gate and experts."""

    name: str = Field(default="moe", pattern=NAME_PATTERN)
    """Its name in the URL; its settings (``top_k``, ``capacity``, timeouts) are those of the router of
    this name in ``serve.config``."""
    gate: str = Field(default="moe-gate", pattern=NAME_PATTERN)
    """The served name of the gate."""
    expert_prefix: str = Field(default="moe-expert-", pattern=NAME_PATTERN)
    """Expert ``i`` is served as ``{expert_prefix}{i}``."""


class ServeStageSpec(StageSpec):
    """What the serve stage serves of this run's artifacts. ``config`` (with ``set``) gives each served
    model's deployment settings (by name), the ingress, auth, limits and HTTP options."""

    models: dict[str, Literal["teacher", "compress"]] = Field(
        default_factory=lambda: {"teacher": "teacher", "student": "compress"}, min_length=1
    )
    """Served model name -> the stage whose artifact it serves."""
    cascade: ServedCascade = Field(default_factory=ServedCascade)
    """The cascade over served models: calibrated by the calibrate stage, served by the serve stage."""
    moe: ServedMoE = Field(default_factory=ServedMoE)
    """The MoE router over the moe stage's gate and experts."""

    @model_validator(mode="after")
    def _cascade_serves_known_models(self) -> "ServeStageSpec":
        unknown = [name for name in self.cascade.stages if name not in self.models]
        if unknown:
            raise ValueError(
                f"serve.cascade.stages: {', '.join(unknown)} not among serve.models "
                f"({', '.join(self.models)})"
            )
        return self

    @property
    def endpoints(self) -> list[str]:
        """Every name served: the models, the cascade and the MoE router."""
        return [*self.models, self.cascade.name, self.moe.name]


class QuerySpec(_Section):
    """The held-out test set sent through the HTTP endpoint."""

    batch_size: PositiveInt = 64
    concurrency: PositiveInt = 4
    max_inputs: Optional[PositiveInt] = None
    """At most this many test inputs per served model (default: all)."""
    seconds: NonNegativeFloat = 0.0
    """Keep sending the test inputs again, per served model, until this many seconds have passed:
    throughput and latency over every request, accuracy over the first pass (0: one pass)."""
    passes: PositiveInt = 1
    """Query every served model this many times, the models in reverse order in every other pass (a
    drift in the machine's speed falls on each alike); a model's row is its median pass by inputs/s, and
    a ratio of two models is the median of their pass-by-pass ratios."""


class PlacementSpec(_Section):
    """Hardware-aware placement of the served models (see ``scaleforge.deployment.placement``)."""

    enabled: bool = True
    hwbench: Optional[str] = None
    """A ``jobs.hwbench`` result (JSON: a local path or a URI) to place by; default: measure the cluster
    when the serve stage starts."""
    gpu_share: float = Field(default=0.25, gt=0.0, le=1.0)
    """Share of a GPU each replica of a large model reserves on a GPU node."""
    gpu_min_parameters: PositiveInt = 100_000
    """Models with at least this many weights count as large (each cascade's last stage always does)."""


class PipelineFaultSpec(_Section):
    fail_at_stage: Optional[Stage] = None
    """Raise at the start of this stage (to show that earlier artifacts survive and ``--from`` resumes)."""


class PipelineJobConfig(_Section):
    """``python -m jobs.pipeline``: the stages every kind of main job has; ``kind`` picks the subclass
    that ``model_validate`` builds (a new kind of pipeline is one more subclass, imported with this
    package)."""

    kind: str
    """Which pipeline: ``classifier`` (the default) or ``lm``."""
    storage: Optional[str] = None
    """The job's storage root, a folder or a URI every node reaches (``s3://bucket/scaleforge``): a relative
    ``output`` is taken under it (``{storage}/pipeline`` when not given)."""
    output: str = "~/scaleforge/pipeline"
    """Every stage's artifacts, runs, records, the serve config and the report go under this folder or
    URI (``s3://bucket/scaleforge/pipeline`` on a cluster whose nodes share no disk)."""
    fault: PipelineFaultSpec = Field(default_factory=PipelineFaultSpec)

    _under_storage = storage_layout({"output": "pipeline"})

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> "PipelineJobConfig":
        if cls is not PipelineJobConfig:
            return super().model_validate(obj, **kwargs)
        kinds = {sub.model_fields["kind"].default: sub for sub in cls.__subclasses__()}
        given = obj.get("kind", "classifier") if isinstance(obj, dict) else getattr(obj, "kind", None)
        if given not in kinds:  # named as any other field's error is: the field, the values it takes
            expected = " or ".join(repr(kind) for kind in kinds)
            error = {"type": "literal_error", "loc": ("kind",), "input": given, "ctx": {"expected": expected}}
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return kinds[given].model_validate(obj, **kwargs)


class PipelineConfig(PipelineJobConfig):
    """``python -m jobs.pipeline``: train, compress, calibrate, serve, query, report."""

    kind: Literal["classifier"] = "classifier"
    teacher: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/train_teacher.yaml"))
    async_sgd: AsyncStageSpec = Field(default_factory=lambda: AsyncStageSpec(config="configs/async_sgd.yaml"))
    compress: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/compress.yaml"))
    moe: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/train_moe.yaml"))
    calibrate: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/calibrate.yaml"))
    serve: ServeStageSpec = Field(default_factory=lambda: ServeStageSpec(config="configs/serve.yaml"))
    query: QuerySpec = Field(default_factory=QuerySpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
