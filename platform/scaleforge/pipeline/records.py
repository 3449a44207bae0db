"""What each stage of the main job recorded (``records/<stage>.json``): one pydantic model per stage.

A record is validated when its stage finishes and again when a later run reads it back, so a
renamed field fails there, naming the file and the field, not in the report at the end of a run.
Rows that another component reports (a trainer's epoch, a parameter-server evaluation, a
compression step) are typed where the pipeline reads them and keep the rest as reported.
"""

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from scaleforge.calibrate.cascade import CascadeCalibration
from scaleforge.data import DataSpec
from scaleforge.deployment.hardware import DeviceReport
from scaleforge.deployment.placement import Placed


class StageRecord(BaseModel):
    """Fields every stage's record has."""

    # Thresholds may be infinite (``.inf`` sends everything on): written as JSON's Infinity, not null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    wall_s: float = 0.0
    """Seconds the stage took (set by the pipeline when the stage finishes)."""


class _Reported(BaseModel):
    """A row reported by another component: the fields the pipeline reads are typed, the others kept."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")


class EpochMetrics(_Reported):
    epoch: int
    test_accuracy: float


class TrainRecord(StageRecord):
    """The teacher: a data-parallel training run on Ray Train."""

    artifact: str
    metrics: dict[str, JsonValue]
    history: list[EpochMetrics] = Field(min_length=1)
    parameters: int


class MoEParts(BaseModel):
    """The artifact manifest's ``moe_parts``: the gate's and the experts' artifact folders."""

    model_config = ConfigDict(extra="forbid")

    gate: str
    experts: list[str] = Field(min_length=1)
    combine: str
    """The gate family the experts were trained with."""
    top_k: int


class MoERecord(TrainRecord):
    """The MoE model, and its gate and experts exported as separate artifacts for serving."""

    parts: MoEParts


class AccuracyAt(_Reported):
    seconds: float
    test_accuracy: float


class AsyncRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    test_accuracy: float
    updates: int
    wall_s: float
    curve: list[AccuracyAt]
    artifact: str
    plot: str


class AsyncSGDRecord(StageRecord):
    """One parameter-server run per consistency mode."""

    runs: dict[str, AsyncRun] = Field(min_length=1)


class VersusTeacher(_Reported):
    smaller: float
    speedup: dict[str, float]
    """Latency ratio to the teacher per batch size (keys are batch sizes as strings, as in JSON)."""


class CompressedModel(_Reported):
    bytes: int
    accuracy: Optional[float] = None
    """A classifier's test accuracy (a language model's row has ``bits_per_byte`` instead)."""
    vs_teacher: VersusTeacher


class CompressionReport(_Reported):
    teacher: CompressedModel
    recipe: list[CompressedModel] = Field(min_length=1)


class CompressRecord(StageRecord):
    """The compression recipe's slim model and its report."""

    artifact: str
    output: str
    report: CompressionReport


class CalibrateRecord(StageRecord, CascadeCalibration):
    """The cascade's thresholds, calibrated on validation data, and what they give on the held-out inputs
    that did not pick them (the serve stage writes them into the serve config; the report plots them)."""

    cascade: str
    stages: list[str]
    """The cascade's served models, cheapest first."""
    data: DataSpec
    calibration_fraction: float
    split_seed: int
    """With ``data`` and ``calibration_fraction``: which held-out inputs calibrated the thresholds
    (:func:`scaleforge.calibrate.held_out_split`); every served model is scored on the others only."""


class Placement(BaseModel):
    """Where the served models were placed, and the measurements that decided it."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    enabled: bool
    cpu_nodes: int = 0
    gpu_nodes: int = 0
    models: dict[str, Placed] = Field(default_factory=dict)
    devices: list[DeviceReport] = Field(default_factory=list)


class LoadedFrom(BaseModel):
    """What a model's replica loaded: the artifact, the local weights file it read (its node's cache
    for a URI) and the Ray node it runs on."""

    model_config = ConfigDict(extra="forbid")

    artifact: str
    weights: str
    node_id: str


class ServeRecord(StageRecord):
    """Serve running with the calibrated config, each model placed for this cluster. It outlives a
    run that stops after this stage (``--to serve``); a later run reuses it while it answers."""

    url: str
    placement: Placement
    serve_config: Optional[str] = None
    """The Serve config as deployed (``serve.yaml``, the one the run writes: this run's artifacts, the
    calibrated thresholds, each model placed): ``jobs.serve`` of it on this cluster finds its apps
    running and keeps their replicas."""
    loaded_from: dict[str, LoadedFrom] = Field(default_factory=dict)
    """Per model with a deployment of its own: what one of its replicas loaded, and on which node."""
    direct_urls: list[str] = Field(default_factory=list)
    """The app's ingress replicas' own URLs where Serve runs with direct ingress (the query stage sends
    to them, skipping the proxy's hop); empty: only through the proxy (``url``)."""


class ServedModelResult(BaseModel):
    """One served model's answers to the held-out test set over HTTP."""

    model_config = ConfigDict(extra="forbid")

    accuracy: float
    p50_ms: float
    p99_ms: float
    inputs_per_s: float
    requests: Optional[int] = None
    """How many requests were sent (one pass over the inputs, or more within ``query.seconds``)."""
    seconds: Optional[float] = None
    """From the first request to the last answer."""
    answered_per_stage: Optional[list[float]] = None
    """Cascades: the share of inputs each stage answered."""
    first_expert_share: Optional[list[float]] = None
    """MoE routers: the share of inputs whose first choice was each expert."""
    fallbacks: Optional[int] = None
    """MoE routers: inputs answered without one of their chosen experts."""
    inputs_per_s_per_pass: Optional[list[float]] = None
    """Every pass's inputs/s, in the order the passes ran (``query.passes``; the row is the median pass)."""

    def ratios_per_pass(self, other: "ServedModelResult") -> list[float]:
        """This model's inputs/s over ``other``'s, pass by pass (each pass queried both, one after the
        other); one ratio where either ran a single pass."""
        if self.inputs_per_s_per_pass and other.inputs_per_s_per_pass:
            return [a / b for a, b in zip(self.inputs_per_s_per_pass, other.inputs_per_s_per_pass)]
        return [self.inputs_per_s / other.inputs_per_s]


class QueryRecord(StageRecord):
    """The held-out test set sent through every served model."""

    url: str
    inputs: int
    placement: Placement
    direct: bool = False
    """Whether the requests went to the ingress replicas' own ports (direct ingress), not the proxy."""
    models: dict[str, ServedModelResult]
    pipeline_wall_s: float
    """Seconds from the pipeline's start to the last answer."""


class ReportRecord(StageRecord):
    """The report, written from the records of the stages before it."""

    report: str
    """``report.md``; its plots lie beside it."""


class Records(BaseModel):
    """Every stage's record, by stage name; a stage not yet run or reused has none."""

    model_config = ConfigDict(extra="forbid")

    teacher: Optional[TrainRecord] = None
    async_sgd: Optional[AsyncSGDRecord] = None
    compress: Optional[CompressRecord] = None
    moe: Optional[MoERecord] = None
    calibrate: Optional[CalibrateRecord] = None
    serve: Optional[ServeRecord] = None
    query: Optional[QueryRecord] = None
    report: Optional[ReportRecord] = None
