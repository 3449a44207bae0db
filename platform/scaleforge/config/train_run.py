"""Where a training run's workers run and how it keeps going: the elastic worker group, checkpoints,
and the faults that prove recovery (sections of :class:`~scaleforge.config.TrainJobConfig`)."""

from typing import Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)


class _Section(BaseModel):
    """A config section: an unknown key is an error, not a silently ignored typo."""

    model_config = ConfigDict(extra="forbid")


class ScalingSpec(_Section):
    """How many Ray Train workers, and what each one gets (``ray.train.ScalingConfig``)."""

    num_workers: PositiveInt = 2
    """Ray Train workers (ranks): ``parallel.dp * fsdp * tp * pp`` of them. ``{min: M, max: N}``: an
    elastic group (``min_workers: M``, ``num_workers: N``)."""
    min_workers: Optional[PositiveInt] = None
    """Elastic training: Ray Train runs the group on as many workers as the cluster has room for, from
    this many to ``num_workers``, restarts it smaller from the last checkpoint when a node leaves and
    larger when one joins. The global batch stays ``optim.batch_size * num_workers`` rows at every size
    (a rank accumulates the gradients of the slices of missing ranks)."""
    resize_interval_s: PositiveFloat = 60.0
    """Elastic training: how often Ray Train looks for room to grow the group
    (``ScalingConfig.elastic_resize_monitor_interval_s``)."""
    use_gpu: bool = False
    """One GPU per worker, NCCL backend; CPU workers use gloo."""
    resources_per_worker: dict[str, float] = Field(default_factory=lambda: {"CPU": 1})
    """Ray resources each worker reserves, e.g. ``{CPU: 2}`` or ``{CPU: 4, GPU: 1}``."""
    device_memory_gb: Optional[PositiveFloat] = None
    """Memory of each worker's device, in GB: a layout whose model state and activations need more
    is refused before Ray starts (``jobs.train --plan`` prints what each layout needs)."""

    @model_validator(mode="before")
    @classmethod
    def _worker_range(cls, data: Any) -> Any:
        """``num_workers: {min: M, max: N}`` is ``min_workers: M, num_workers: N``."""
        if isinstance(data, dict) and isinstance(bounds := data.get("num_workers"), dict):
            if set(bounds) != {"min", "max"}:
                raise ValueError("scaling.num_workers is a count or a range {min: M, max: N}")
            data = {**data, "num_workers": bounds["max"], "min_workers": bounds["min"]}
        return data

    @model_validator(mode="after")
    def _ordered_range(self) -> "ScalingSpec":
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(
                f"scaling.num_workers: min ({self.min_workers}) is above max ({self.num_workers})"
            )
        return self

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    def describe(self) -> str:
        """``4`` or ``{min: 1, max: 4}``."""
        return (
            f"{{min: {self.min_workers}, max: {self.num_workers}}}" if self.elastic else str(self.num_workers)
        )


class RunSpec(_Section):
    """Where checkpoints go and how failures are handled (``ray.train.RunConfig``)."""

    name: Optional[str] = None
    """Run name under ``storage_path``; reusing a name resumes that run. Default: unique per launch."""
    storage_path: str = "~/scaleforge/runs"
    """Checkpoint storage: a local folder, or any URI of Ray's storage layer (``s3://bucket/prefix``)."""
    max_failures: NonNegativeInt = 1
    """Worker-group restarts from the latest checkpoint before the run fails."""
    checkpoint_every: PositiveInt = 1
    """Checkpoint every N epochs (and after the last)."""
    checkpoint_every_steps: Optional[PositiveInt] = None
    """Also checkpoint every N optimiser steps, with each rank's position in the data and its RNG state:
    a restarted run continues with the next unseen batch, so it repeats fewer than N steps. The
    batches then come from one seeded order of the whole training set that every worker reads."""
    checkpoint_upload: Literal["sync", "async"] = "sync"
    """``async``: a checkpoint is written to the worker's local disk at the step, then uploaded to
    ``storage_path`` by Ray Train's background thread (one upload in flight) while training goes on;
    ``sync``: every worker waits for the upload."""
    preemption_check_every_steps: Optional[PositiveInt] = 10
    """With ordered batches (``checkpoint_every_steps`` or an elastic group): ask Ray Train every this many
    steps whether a node of the group is being drained (``ray drain-node --reason
    DRAIN_NODE_REASON_PREEMPTION``, a cloud's spot notice); if so, checkpoint at once and take no further
    step until the group restarts without it (``null``: never ask)."""
    preemption_wait_s: NonNegativeFloat = 10.0
    """After a preemption checkpoint, how long past the notice's deadline to wait for the restart before
    training on (the node was not taken after all)."""
    keep_checkpoints: PositiveInt = 2
    """Checkpoints retained in storage."""
    log_every_steps: Optional[PositiveInt] = None
    """A progress line every this many optimiser steps: tokens (or examples) per second and, for a
    language model, model TFLOP/s and MFU."""
    peak_tflops: Optional[PositiveFloat] = None
    """Dense peak of one worker's device in TFLOP/s (``jobs.hwbench`` measures it): the MFU's denominator."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """Ray Train's own console logging; WARNING leaves the per-epoch progress lines readable."""
    compile: bool = False
    """``torch.compile`` (inductor) each transformer layer's computation, or the whole model of another
    family, on every rank; what fails to compile runs eagerly, with a one-line message."""


class FaultSpec(_Section):
    """Deliberate failures, to prove recovery."""

    kill_worker_at_epoch: Optional[PositiveInt] = None
    """The last rank calls ``os._exit(1)`` halfway through this (1-based) epoch, once: not after a resume."""
    kill_worker_at_step: Optional[PositiveInt] = None
    """The last rank calls ``os._exit(1)`` before this (1-based) optimiser step, once: not after a resume
    (with ``run.checkpoint_every_steps``)."""
