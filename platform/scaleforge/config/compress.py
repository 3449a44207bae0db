"""Schema of the compression job (``jobs.compress``): the teacher, an ordered recipe, sweeps.

Everything a recipe could get wrong is checked here, before Ray starts or a byte is written:
unknown steps and fields (pydantic), sparsity outside [0, 1), and, against the teacher's
architecture (rebuilt from its checksum-verified artifact), unknown layer names and ranks
larger than a layer. The recipe is walked on a skeleton of the model as each step changes it,
so a later step is checked against the student or the pruned shapes it will really see.
"""

import copy
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator
from torch import nn

from scaleforge.artifacts import ArtifactError, load_artifact
from scaleforge.config.schema import OptimSpec, RunSpec, ScalingSpec
from scaleforge.data import DataSpec
from scaleforge.models import ModelSpec, build_model
from scaleforge.models.surgery import default_layers, prunable_layers


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
    """The student architecture (any registry model)."""
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


Step = Annotated[Union[DistillStep, PruneStep, LowRankStep, QuantizeStep, ExportStep], Field(discriminator="step")]
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
            raise ValueError(f"param {self.param!r} cannot be swept for step {self.step.step!r}; "
                             f"sweepable: {', '.join(allowed) or 'nothing'}")
        for value in self.values:
            type(self.step).model_validate({**self.step.model_dump(), self.param: value})
        return self

    def steps(self) -> list:
        """The concrete step of every sweep value."""
        return [type(self.step).model_validate({**self.step.model_dump(), self.param: v}) for v in self.values]


class MeasureSpec(_Section):
    """How latency is measured (on CPU, in one process, every model side by side)."""

    threads: PositiveInt = 1
    """``torch.set_num_threads`` for every latency measurement (the same for all models) and the driver's work."""
    repeats: PositiveInt = 30
    """Timed forward passes per batch size; the median is reported."""
    batch_sizes: list[PositiveInt] = Field(default=[1, 64], min_length=1)


class CompressJobConfig(_Section):
    """``python -m jobs.compress``: compress a trained model artifact with an ordered recipe."""

    teacher: str = "~/scaleforge/artifacts/teacher"
    """Artifact folder of the model to compress (its sha256 is verified before anything runs)."""
    data: DataSpec = Field(default_factory=DataSpec)
    """The data the teacher was trained on (fine-tuning, calibration, distillation, evaluation)."""
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
    """Folder for the slim artifact (``output/model``), every step's artifact and the report."""

    @model_validator(mode="after")
    def _recipe_fits_teacher(self) -> "CompressJobConfig":
        if not (self.data.is_mnist1d or self.data.source.endswith(".npz")):
            raise ValueError("data.source: compression fine-tunes and calibrates in memory; use mnist1d or a .npz file")
        if not Path(self.teacher).expanduser().is_dir():
            raise ValueError(f"teacher: artifact folder {self.teacher!r} does not exist")
        try:
            teacher = load_artifact(self.teacher)
        except ArtifactError as err:
            raise ValueError(f"teacher: {err}") from None
        check_recipe(self.recipe, teacher.model, teacher.manifest, "recipe")
        for index, sweep in enumerate(self.sweeps):
            for step in sweep.steps():
                check_recipe([step], teacher.model, teacher.manifest, f"sweeps[{index}] ({sweep.name})")
        return self


def check_recipe(steps: list, model: nn.Module, manifest: dict, where: str) -> None:
    """Raise ValueError naming the step and the problem if ``steps`` cannot run on ``model``."""
    from scaleforge.compress.prune import prune_structured  # the real step, on a skeleton

    schemes = [edit["scheme"] for edit in manifest.get("architecture") or [] if edit["op"] == "quantize"]
    skeleton, spec, quantized, int8 = model, manifest["model"], bool(schemes), any(s.startswith("int8") for s in schemes)
    for index, step in enumerate(steps):
        label = f"{where}[{index}] ({step.step})"
        if quantized and step.step != "export":
            raise ValueError(f"{label}: the model is already quantized; only export can follow quantize")
        if step.step == "distill":
            skeleton, spec = build_model(step.student, manifest["input_dim"], manifest["num_classes"]), \
                step.student.model_dump()
        elif step.step == "prune":
            _check_layers(label, skeleton, step.layers, (nn.Linear, nn.Conv1d))
            if step.method == "structured":
                skeleton = prune_structured(copy.deepcopy(skeleton), step.sparsity, step.layers, manifest["input_dim"])
        elif step.step == "low_rank":
            _check_layers(label, skeleton, step.layers, (nn.Linear,))
            for name in step.layers or default_layers(skeleton, (nn.Linear,)):
                layer = skeleton.get_submodule(name)
                if step.rank is not None and step.rank > min(layer.in_features, layer.out_features):
                    raise ValueError(f"{label}: rank {step.rank} is larger than layer {name!r} allows "
                                     f"({layer.out_features} x {layer.in_features}: at most "
                                     f"{min(layer.in_features, layer.out_features)})")
        elif step.step == "quantize":
            quantized, int8 = True, step.scheme.startswith("int8")
            if step.scheme == "int8_static" and spec["name"] not in ("mlp", "cnn1d"):
                raise ValueError(f"{label}: int8_static supports mlp and cnn1d models; use int8_dynamic for "
                                 f"{spec['name']!r}")
        elif step.step == "export":
            if index != len(steps) - 1:
                raise ValueError(f"{label}: export must be the last step")
            if step.onnx and int8:
                raise ValueError(f"{label}: onnx export takes fp32 or half-precision models, not eager int8 modules")


def _check_layers(label: str, model: nn.Module, names: Optional[list[str]], kinds: tuple) -> None:
    available = [name for name, layer in prunable_layers(model).items() if isinstance(layer, kinds)]
    for name in names or []:
        if name not in available:
            raise ValueError(f"{label}: unknown layer {name!r}; layers: {', '.join(available)}")
