"""Schema of the compression job (``jobs.compress``): the teacher, an ordered recipe, sweeps.

The schema checks what the fields alone decide: unknown steps and fields, sparsity outside
[0, 1), one rank rule per low-rank step, sweepable parameters, a language model's student on
text. Whether the recipe fits the teacher (layer names, ranks, the shapes each step leaves
behind, steps that do not apply to a language model) needs the teacher's artifact and is
:func:`scaleforge.compress.preflight.check_runnable`'s, before Ray starts.
"""

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.capabilities import either
from scaleforge.config.data import DataSpec, TrainDataSpec
from scaleforge.config.models import ModelSpec, family_names
from scaleforge.config.schema import OptimSpec, RunSpec, ScalingSpec
from scaleforge.config.storage_root import storage_layout


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FinetuneSpec(_Section):
    """Fine-tuning after pruning or factorization (plain torch on one worker; Han et al. retrain at lr/10)."""

    epochs: NonNegativeInt = 2
    """Passes over the training set after each pruning round or factorization (0: none)."""
    lr: PositiveFloat = 3e-4
    """Constant AdamW learning rate (about a tenth of the teacher's)."""
    batch_size: PositiveInt = 128
    seed: int = 0


class DistillStep(_Section):
    """Train ``student`` on the teacher's temperature-softened outputs plus the hard labels (Hinton et al. 2015)."""

    step: Literal["distill"]
    student: ModelSpec
    """The student architecture (any registry model; a ``transformer_lm`` for a language model on text,
    trained on the teacher's next-token distribution at every position)."""
    temperature: PositiveFloat = 4.0
    """Softmax temperature of both teacher and student in the soft-target term (Hinton: 2.5-4 for small students)."""
    alpha: float = Field(default=0.7, ge=0.0, le=1.0)
    """Weight of the soft-target term; the hard-label cross-entropy gets ``1 - alpha``."""
    optim: OptimSpec = Field(default_factory=lambda: OptimSpec(epochs=10))
    """Student training (data-parallel on Ray Train, ``scaling`` workers)."""
    compare_hard_labels: bool = True
    """Also train the same student on hard labels alone (same epochs and seed) as the baseline."""


class PruneStep(_Section):
    """Magnitude pruning: unstructured (zeros, via ``torch.nn.utils.prune``) or structured (narrower layers)."""

    step: Literal["prune"]
    method: Literal["unstructured", "structured"] = "unstructured"
    """``structured`` removes whole conv channels / neurons (torch-pruning's dependency graph) so layers shrink."""
    sparsity: float = Field(ge=0.0, lt=1.0)
    """Unstructured: share of weights set to zero. Structured: share of channels removed from each layer."""
    scope: Literal["global", "layer"] = "global"
    """Unstructured only: rank weights across all ``layers`` at once, or per layer."""
    layers: Optional[list[str]] = None
    """Layers to prune (Linear/Conv1d names such as ``head.1``); default all but the output layer."""
    rounds: PositiveInt = 1
    """Iterative pruning: reach ``sparsity`` in this many equal steps, fine-tuning after each."""
    finetune: FinetuneSpec = Field(default_factory=FinetuneSpec)


class LowRankStep(_Section):
    """Replace Linear weights W (m x n) by U V^T of rank k, then fine-tune."""

    step: Literal["low_rank"]
    layers: Optional[list[str]] = None
    """Linear layers to factorize; default all but the output layer."""
    rank: Optional[PositiveInt] = None
    """Fixed rank k for every listed layer."""
    energy: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    """Or: the smallest k keeping this share of each layer's spectral energy (sum of squared singular values)."""
    finetune: FinetuneSpec = Field(default_factory=FinetuneSpec)

    @model_validator(mode="after")
    def _one_rank_rule(self) -> "LowRankStep":
        if (self.rank is None) == (self.energy is None):
            raise ValueError("give exactly one of rank (fixed k) or energy (spectral energy to keep)")
        return self


class QuantizeStep(_Section):
    """int8 for CPU inference, or fp16/bf16 casting for GPU serving."""

    step: Literal["quantize"]
    scheme: Literal["int8_static", "int8_dynamic", "fp16", "bf16"] = "int8_static"
    """``int8_static``: Conv1d and Linear in int8 with calibrated activations (fast convolutions);
    ``int8_dynamic``: Linear layers only; ``fp16``/``bf16``: cast for GPU serving."""
    calibration_samples: PositiveInt = 2048
    """Training examples run through the model to calibrate int8 activation ranges."""


class ExportStep(_Section):
    """Write the artifact (always done); optionally also ONNX for edge runtimes."""

    step: Literal["export"]
    onnx: bool = False
    """Also write ``model.onnx`` next to the artifact (fp32 and fp16 models; int8 eager modules do not export)."""


Step = Annotated[
    Union[DistillStep, PruneStep, LowRankStep, QuantizeStep, ExportStep], Field(discriminator="step")
]
_SWEEPABLE = {"prune": ("sparsity",), "low_rank": ("rank", "energy"), "quantize": ("scheme",)}


class SweepSpec(_Section):
    """One step applied to the teacher at several settings, each setting a parallel Ray task."""

    name: str
    """Label in the report and the output folder name."""
    step: Step
    param: str
    """The field of ``step`` that varies: ``sparsity``, ``rank``, ``energy`` or ``scheme``."""
    values: list[Union[int, float, str]] = Field(min_length=1)

    @model_validator(mode="after")
    def _param_varies(self) -> "SweepSpec":
        allowed = _SWEEPABLE.get(self.step.step, ())
        if self.param not in allowed:
            raise ValueError(
                f"param {self.param!r} cannot be swept for step {self.step.step!r}; "
                f"sweepable: {', '.join(allowed) or 'nothing'}"
            )
        for value in self.values:
            type(self.step).model_validate({**self.step.model_dump(), self.param: value})
        return self

    def steps(self) -> list:
        """The concrete step of every sweep value."""
        return [
            type(self.step).model_validate({**self.step.model_dump(), self.param: v}) for v in self.values
        ]


class MeasureSpec(_Section):
    """How latency is measured (on CPU, in one process, every model side by side)."""

    threads: PositiveInt = 1
    """``torch.set_num_threads`` for every latency measurement (the same for all models) and the driver's work."""
    repeats: PositiveInt = 30
    """Timed forward passes per batch size; the median is reported."""
    batch_sizes: list[PositiveInt] = Field(default=[1, 64], min_length=1)


class CompressJobConfig(_Section):
    """``python -m jobs.compress``: compress a trained model artifact with an ordered recipe."""

    storage: Optional[str] = None
    """The job's storage root, a folder or a URI every node reaches (``s3://bucket/scaleforge``): a path
    the config leaves out or gives relative goes under it, ``teacher`` from ``{storage}/artifacts/teacher``,
    ``output`` to ``{storage}/artifacts/compressed`` and ``run.storage_path`` to ``{storage}/runs``."""
    teacher: str = "~/scaleforge/artifacts/teacher"
    """Artifact (folder or URI) of the model to compress (its sha256 is verified before anything runs)."""
    data: TrainDataSpec = Field(default_factory=DataSpec)
    """The data the teacher was trained on (fine-tuning, calibration, distillation, evaluation): arrays,
    scored by test accuracy, or (``kind: text``, a language model) text, scored by validation bits per byte."""
    recipe: list[Step] = Field(min_length=1)
    """Ordered steps; each starts from the previous step's model."""
    sweeps: list[SweepSpec] = Field(default_factory=list)
    """Single steps applied to the teacher at several settings, in parallel (accuracy-vs-sparsity plots)."""
    measure: MeasureSpec = Field(default_factory=MeasureSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    """Ray Train workers for distillation."""
    run: RunSpec = Field(default_factory=RunSpec)
    """Checkpoint storage of the distillation runs."""
    output: str = "~/scaleforge/artifacts/compressed"
    """Folder or URI for the slim artifact (``output/model``), every step's artifact and the report."""

    _under_storage = storage_layout(
        {"teacher": "artifacts/teacher", "output": "artifacts/compressed", "run.storage_path": "runs"}
    )

    @model_validator(mode="after")
    def _in_memory_data(self) -> "CompressJobConfig":
        if not (self.data.kind == "text" or self.data.is_mnist1d or self.data.suffix == ".npz"):
            raise ValueError(
                "data.source: compression fine-tunes and calibrates in memory; use mnist1d or a .npz file"
            )
        return self

    @model_validator(mode="after")
    def _students_fit_the_data(self) -> "CompressJobConfig":
        text = self.data.kind == "text"
        for index, step in enumerate(self.recipe):
            if step.step == "distill" and text != step.student.capabilities.language_model:
                problem = (
                    f"text (data.kind=text) distills into a "
                    f"{either(family_names(lambda c: c.language_model))}, not {step.student.name}"
                    if text
                    else f"a {step.student.name} learns from text; set data.kind=text"
                )
                raise ValueError(f"recipe[{index}] (distill): student: {problem}")
        return self
