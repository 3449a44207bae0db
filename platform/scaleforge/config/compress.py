"""Schema of the compression job (``jobs.compress``): the teacher, an ordered recipe, sweeps.

The recipe's entries are the registered steps (:mod:`scaleforge.compress.steps`), each with its
fields and what those alone decide (sparsity in [0, 1), one rank rule, a language model's student
on text); this schema checks unknown steps and sweepable parameters. Whether the recipe fits the
teacher (layer names, ranks, the shapes each step leaves behind, steps that do not apply to a
language model) needs the teacher's artifact and is
:func:`scaleforge.compress.preflight.check_runnable`'s, before Ray starts.
"""

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from scaleforge.compress.steps.registry import step_union
from scaleforge.config.data import DataSpec, TrainDataSpec
from scaleforge.config.schema import RunSpec, ScalingSpec
from scaleforge.config.storage_root import storage_layout


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


Step = step_union()
"""A recipe entry: one of the registered steps (:mod:`scaleforge.compress.steps`), tagged by ``step``."""


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
        allowed = type(self.step).sweepable
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
    """``torch.set_num_threads`` for every latency measurement (the same for all models) and the
    driver's work."""
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
    scored by test accuracy, or (``kind: text``, a language model) text, scored by validation bits per
    byte."""
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
    def _steps_fit_the_data(self) -> "CompressJobConfig":
        for index, step in enumerate(self.recipe):
            problem = step.data_problem(self.data)
            if problem:
                raise ValueError(f"recipe[{index}] ({step.step}): {problem}")
        return self
