"""Schema of the main job (``jobs.pipeline``): every stage's own config, chained through one output folder."""

from pathlib import Path
from typing import Literal, Optional, get_args

from pydantic import Field, PositiveInt, model_validator

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.config.loader import ConfigError, load_config
from scaleforge.config.schema import TrainJobConfig, _Section

Stage = Literal["teacher", "async_sgd", "compress", "moe", "calibrate", "serve", "query"]
"""The main job's stages, in the order they run: the one list that ``STAGES`` and ``--from`` read."""
STAGES: tuple[Stage, ...] = get_args(Stage)


class StageSpec(_Section):
    """One stage: the config file of its own job, and ``--set``-style overrides of it."""

    config: str
    set: list[str] = Field(default_factory=list)


class AsyncStageSpec(StageSpec):
    modes: list[Literal["sync", "async", "ssp"]] = Field(default_factory=lambda: ["sync", "async"], min_length=1)
    """One parameter-server run per mode, for the sync-against-async plot."""


class QuerySpec(_Section):
    """The held-out test set sent through the HTTP endpoint."""

    batch_size: PositiveInt = 64
    concurrency: PositiveInt = 4
    max_inputs: Optional[PositiveInt] = None
    """At most this many test inputs per served model (default: all)."""


class PlacementSpec(_Section):
    """Hardware-aware placement of the served models (see ``scaleforge.placement``)."""

    enabled: bool = True
    hwbench: Optional[str] = None
    """A ``jobs.hwbench`` result (JSON) to place by; default: measure the cluster when the serve stage starts."""
    gpu_share: float = Field(default=0.25, gt=0.0, le=1.0)
    """Share of a GPU each replica of a large model reserves on a GPU node."""
    gpu_min_parameters: PositiveInt = 100_000
    """Models with at least this many weights count as large (each cascade's last stage always does)."""

    @model_validator(mode="after")
    def _result_exists(self) -> "PlacementSpec":
        if self.hwbench and not Path(self.hwbench).expanduser().is_file():
            raise ValueError(f"placement.hwbench: {self.hwbench!r} does not exist (run python -m jobs.hwbench)")
        return self


class PipelineFaultSpec(_Section):
    fail_at_stage: Optional[Stage] = None
    """Raise at the start of this stage (to show that earlier artifacts survive and ``--from`` resumes)."""


class PipelineConfig(_Section):
    """``python -m jobs.pipeline``: train, compress, calibrate, serve, query, report."""

    output: str = "~/scaleforge/pipeline"
    """Every stage's artifacts, records and the report go under this folder."""
    teacher: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/train_teacher.yaml"))
    async_sgd: AsyncStageSpec = Field(default_factory=lambda: AsyncStageSpec(config="configs/async_sgd.yaml"))
    compress: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/compress.yaml"))
    moe: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/train_moe.yaml"))
    calibrate: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/calibrate.yaml"))
    serve: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/serve.yaml"))
    query: QuerySpec = Field(default_factory=QuerySpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    fault: PipelineFaultSpec = Field(default_factory=PipelineFaultSpec)

    @model_validator(mode="after")
    def _stage_configs_load(self) -> "PipelineConfig":
        """The training stages' configs validate now; the later ones need earlier artifacts and are
        checked when their stage starts (their files must exist already)."""
        for name, schema in (("teacher", TrainJobConfig), ("async_sgd", AsyncSGDConfig), ("moe", TrainJobConfig)):
            spec = getattr(self, name)
            try:
                load_config(schema, spec.config, spec.set)
            except ConfigError as err:
                raise ValueError(f"stage {name}: {err}") from None
        for name in ("compress", "calibrate", "serve"):
            if not Path(getattr(self, name).config).is_file():
                raise ValueError(f"{name}.config: {getattr(self, name).config!r} does not exist")
        return self
