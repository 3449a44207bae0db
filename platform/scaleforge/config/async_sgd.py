"""Schema of the parameter-server job (``jobs.async_sgd``)."""

from typing import Literal, Optional

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.data import DataSpec, TrainDataSpec
from scaleforge.config.models import CNN1dSpec, ModelSpec
from scaleforge.config.schema import ArtifactSpec, _Section, check_task
from scaleforge.config.storage_root import storage_layout
from scaleforge.paramserver.consistency import POLICIES, modes_where


class ServerSpec(_Section):
    """The parameter server: shards, consistency and the optimiser they apply."""

    mode: Literal["sync", "async", "ssp"] = "async"
    """``sync``: average all workers' gradients each step; ``async``: apply as they come;
    ``ssp``: async, but a worker more than ``staleness_bound`` steps ahead of the slowest waits."""
    num_shards: PositiveInt = 2
    """Actors the flat parameter vector is split across (balanced by bytes)."""
    staleness_bound: NonNegativeInt = 2
    """SSP's s."""
    staleness_aware_lr: bool = False
    """Divide each update's step by its staleness (Zhang et al. 2016)."""
    backup_workers: NonNegativeInt = 0
    """Sync only: a round applies the first ``num_workers - backup_workers`` gradients to arrive and drops
    the rest as late (Chen et al. 2016), so that no round waits for a straggler."""
    optimizer: Literal["sgd", "adam"] = "adam"
    """Optimiser each shard applies to its slice."""
    lr: PositiveFloat = 1e-3
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """SGD only."""
    checkpoint_every: NonNegativeInt = 0
    """Shards checkpoint slice, optimiser state and version every K updates (0: never)."""


class ScalingEvent(_Section):
    """Dynamic scaling: from ``at_s`` seconds into the run, train with ``workers`` workers."""

    at_s: PositiveFloat
    workers: PositiveInt


class WorkerSpec(_Section):
    """The workers: how many, their batches, and a simulated straggler."""

    num_workers: PositiveInt = 2
    batch_size: PositiveInt = 64
    epochs: PositiveFloat = 5.0
    """Passes over each worker's data shard."""
    seed: int = 0
    straggler_delay_s: float = Field(default=0.0, ge=0.0)
    """Extra seconds per step for the last worker (0: no straggler)."""
    transient_delay_s: float = Field(default=0.0, ge=0.0)
    """Extra seconds for a step that a transient straggler hits (see ``transient_delay_probability``)."""
    transient_delay_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    """Each step of each worker is delayed by ``transient_delay_s`` with this probability, independently
    (seeded by ``seed``): every worker is sometimes slow."""
    weight_prediction: bool = False
    """Async and ssp: compute each gradient at the parameters predicted for when it lands, the read ones
    moved on by the updates expected in between (weight prediction, Chen et al. 2018; Hakimi et al. 2019)."""
    scaling: list[ScalingEvent] = Field(default_factory=list)
    """Add or remove workers while the run trains, e.g. ``[{at_s: 5, workers: 3}]``."""


class PSRunSpec(_Section):
    output_dir: str = "~/scaleforge/async_sgd"
    """Where the run summary (JSON), the accuracy plot (PNG) and shard checkpoints go: a folder or a URI."""
    eval_every_s: PositiveFloat = 1.0
    """Wall-clock seconds between test-accuracy measurements."""
    stop_at_accuracy: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    """Stop as soon as a measurement reaches this test accuracy (time-to-accuracy runs; classifiers)."""
    max_seconds: Optional[PositiveFloat] = None
    """A time budget: stop once this many seconds of training have passed (counted from the moment every
    worker is up, as the accuracy curve is) and export the model as it stands then."""
    placement_timeout_s: PositiveFloat = 300.0
    """How long to wait for the cluster to fit the run's placement group (an autoscaler may be adding
    nodes) before failing with the resources it lacks."""


class PSFaultSpec(_Section):
    """Deliberate failures, to prove recovery."""

    kill_worker_at_step: Optional[PositiveInt] = None
    """Worker 0 SIGKILLs its own process at this step; the run replaces it and goes on."""
    kill_shard_at_update: Optional[PositiveInt] = None
    """Shard 0 SIGKILLs its own process at this version; Ray restarts it from its checkpoint."""


class AsyncSGDConfig(_Section):
    """``python -m jobs.async_sgd``: SGD on parameter-server shards and worker actors (Ray Core)."""

    storage: Optional[str] = None
    """The job's storage root, a folder or a URI every node reaches (``s3://bucket/scaleforge``): a path
    the config leaves out or gives relative goes under it, ``run.output_dir`` to ``{storage}/async_sgd``
    and ``artifact.dir`` to ``{storage}/artifacts/async_sgd``."""
    data: TrainDataSpec = Field(default_factory=DataSpec)
    """Arrays of examples and labels, or (``kind: text``) text for a language model (``transformer_lm``)."""
    model: ModelSpec = Field(default_factory=lambda: CNN1dSpec(batch_norm=False))
    server: ServerSpec = Field(default_factory=ServerSpec)
    workers: WorkerSpec = Field(default_factory=WorkerSpec)
    run: PSRunSpec = Field(default_factory=PSRunSpec)
    fault: PSFaultSpec = Field(default_factory=PSFaultSpec)
    artifact: ArtifactSpec = Field(
        default_factory=lambda: ArtifactSpec(dir="~/scaleforge/artifacts/async_sgd")
    )

    _under_storage = storage_layout({"run.output_dir": "async_sgd", "artifact.dir": "artifacts/async_sgd"})

    @model_validator(mode="after")
    def _consistent(self) -> "AsyncSGDConfig":
        """Rules among the fields; what needs the data or a built model is
        :func:`scaleforge.paramserver.preflight.check_runnable`'s."""
        if sorted(e.at_s for e in self.workers.scaling) != [e.at_s for e in self.workers.scaling]:
            raise ValueError("workers.scaling events must be in order of at_s")
        check_task(self.data, self.model)
        if self.data.kind == "text" and self.run.stop_at_accuracy is not None:
            raise ValueError(
                "run.stop_at_accuracy applies to a classifier; a language model is scored in "
                "validation bits per byte"
            )
        policy = POLICIES[self.server.mode]  # what each consistency mode takes is its policy's to say
        if self.server.backup_workers and not policy.takes_backup_workers:
            raise ValueError(
                f"server.backup_workers applies to server.mode={modes_where('takes_backup_workers')}, "
                f"not {self.server.mode}"
            )
        if self.server.backup_workers >= self.workers.num_workers:
            raise ValueError(
                f"server.backup_workers ({self.server.backup_workers}) must be smaller than "
                f"workers.num_workers ({self.workers.num_workers}): a round needs one gradient"
            )
        if self.workers.weight_prediction and not policy.predicts_weights:
            raise ValueError(
                f"workers.weight_prediction applies to server.mode={modes_where('predicts_weights')}: "
                f"a {self.server.mode} round's gradients are computed on the parameters they update"
            )
        if self.workers.transient_delay_probability and not self.workers.transient_delay_s:
            raise ValueError("workers.transient_delay_probability needs workers.transient_delay_s > 0")
        if self.fault.kill_shard_at_update is not None and not self.server.checkpoint_every:
            raise ValueError("fault.kill_shard_at_update needs server.checkpoint_every > 0 to restore from")
        return self
