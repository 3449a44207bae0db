"""Schema of the training job (``jobs.train``): fields and the rules among them."""

from typing import Literal, Optional

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.capabilities import either
from scaleforge.config.data import DataSpec, TrainDataSpec
from scaleforge.config.models import CNN1dSpec, ModelSpec, check_task, family_names
from scaleforge.config.parallel import ParallelSpec
from scaleforge.config.storage_root import storage_layout
from scaleforge.config.train_run import FaultSpec, RunSpec, ScalingSpec, _Section
from scaleforge.distributed.dims import ParallelDims


class OptimSpec(_Section):
    """Optimiser, batch size and learning-rate schedule."""

    epochs: PositiveInt = 10
    """Passes over the training set."""
    batch_size: PositiveInt = 128
    """Rows of one forward pass per data rank; the global batch is ``batch_size * data ranks *
    accumulate_steps``."""
    accumulate_steps: PositiveInt = 1
    """Batches whose gradients add up to one optimiser step, all-reduced once, with the last (DDP
    ``no_sync``, FSDP ``set_requires_gradient_sync``): the step of one batch this many times larger."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """``adamw`` or ``sgd`` (Nesterov momentum)."""
    lr: PositiveFloat = 3e-3
    """Peak learning rate at ``base_batch_size`` (scaled with the global batch if ``lr_scaling: linear``)."""
    lr_scaling: Literal["none", "linear"] = "none"
    """``linear``: lr x global_batch / base_batch_size (Goyal et al. 2017)."""
    base_batch_size: PositiveInt = 256
    """Reference batch of ``lr`` for linear scaling."""
    warmup_epochs: float = Field(default=0.0, ge=0.0)
    """Linear warm-up from 0 to the peak lr over this many epochs (Goyal et al. use 5)."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After warm-up: cosine decay to zero, or constant."""
    weight_decay: float = Field(default=1e-4, ge=0.0)
    decay_norms_and_biases: bool = True
    """``false``: no weight decay on one-dimensional parameters (norms, biases), as GPT-2 and nanoGPT
    train."""
    clip_grad_norm: Optional[PositiveFloat] = None
    """Clip the whole model's gradient to this norm after every backward pass (across every shard and
    stage)."""
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """SGD only."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: mixed precision on CPU or GPU: training's matmuls in bf16 (``torch.autocast``); weights,
    gradients, optimiser state and evaluation in fp32."""
    seed: int = 0
    """Seed for initialisation and shuffling."""


class ArtifactSpec(_Section):
    """Where the trained model is exported."""

    dir: str = "~/scaleforge/artifacts/model"
    """Artifact folder (``model.safetensors`` + ``manifest.json``), or a URI (``s3://bucket/prefix``);
    replaced atomically."""


class TrainJobConfig(_Section):
    """``python -m jobs.train``: training on Ray Train, data, expert or model parallel (``parallel``)."""

    storage: Optional[str] = None
    """The job's storage root, a folder or a URI every node reaches (``s3://bucket/scaleforge``): a path
    the config leaves out or gives relative goes under it, ``artifact.dir`` to ``{storage}/artifacts/model``
    and ``run.storage_path`` to ``{storage}/runs``."""
    data: TrainDataSpec = Field(default_factory=DataSpec)
    """Arrays of examples and labels, or (``kind: text``) text for a language model."""
    model: ModelSpec = Field(default_factory=CNN1dSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    run: RunSpec = Field(default_factory=RunSpec)
    artifact: ArtifactSpec = Field(default_factory=ArtifactSpec)
    fault: FaultSpec = Field(default_factory=FaultSpec)

    _under_storage = storage_layout({"artifact.dir": "artifacts/model", "run.storage_path": "runs"})

    @model_validator(mode="after")
    def _consistent(self) -> "TrainJobConfig":
        """Rules among the fields; what needs the data or a built model is
        :func:`scaleforge.train.preflight.check_runnable`'s."""
        if self.scaling.use_gpu and self.scaling.resources_per_worker.get("GPU", 1) <= 0:
            raise ValueError(
                "scaling.use_gpu=true needs a positive GPU count in scaling.resources_per_worker"
            )
        kill = self.fault.kill_worker_at_epoch
        if kill is not None:
            if self.run.max_failures < 1:
                raise ValueError("fault.kill_worker_at_epoch needs run.max_failures >= 1 to recover")
            if kill <= self.run.checkpoint_every or kill > self.optim.epochs:
                raise ValueError(
                    f"fault.kill_worker_at_epoch ({kill}) must come after the first checkpoint "
                    f"(run.checkpoint_every={self.run.checkpoint_every}) "
                    f"and within optim.epochs ({self.optim.epochs})"
                )
        if self.parallel.activation_checkpointing != "none" and not self.model.capabilities.recomputes:
            layered = either(family_names(lambda c: c.recomputes))
            raise ValueError(
                f"parallel.activation_checkpointing needs transformer layers: model.name={layered}"
            )
        if self.run.compile and self.parallel.activation_checkpointing == "selective":
            raise ValueError(
                "run.compile with parallel.activation_checkpointing=selective: torch.compile cannot compile "
                "selective checkpointing's recomputation (torch 2.13); use full, or compile=false"
            )
        self._check_step_fault()
        self._check_parallel_layout()
        self._check_elastic()
        check_task(self.data, self.model)
        return self

    def _check_step_fault(self) -> None:
        kill, fault = self.fault.kill_worker_at_step, self.fault
        if kill is None:
            return
        every = self.run.checkpoint_every_steps
        if fault.kill_worker_at_epoch is not None:
            raise ValueError("set one of fault.kill_worker_at_epoch and fault.kill_worker_at_step")
        if every is None or kill <= every:
            raise ValueError(
                f"fault.kill_worker_at_step ({kill}) must come after the first step checkpoint "
                f"(run.checkpoint_every_steps={every})"
            )
        if self.run.max_failures < 1:
            raise ValueError("fault.kill_worker_at_step needs run.max_failures >= 1 to recover")

    def _check_elastic(self) -> None:
        """Ray Train's elastic policy may start the group at any size of the range: every one must take
        the layout (only data parallelism grows and shrinks)."""
        scaling = self.scaling
        if not scaling.elastic:
            return
        if self.parallel.dp is not None:
            raise ValueError(
                "parallel.dp is the elastic dimension: leave it out with scaling.num_workers "
                f"{scaling.describe()}"
            )
        for size in range(scaling.min_workers, scaling.num_workers + 1):
            try:
                self.dims_at(size)
            except ValueError as err:
                raise ValueError(
                    f"scaling.num_workers {scaling.describe()}: Ray Train may run the group on any size in "
                    f"the range, and {size} workers cannot take this layout ({err})"
                ) from None

    def dims_at(self, workers: int) -> ParallelDims:
        """The layout on ``workers`` ranks, ``parallel.dp`` filled in (an elastic group's current size)."""
        p = self.parallel
        return ParallelDims.resolve(
            workers,
            dp=p.dp if workers == self.scaling.num_workers else None,
            fsdp=p.fsdp,
            tp=p.tp,
            pp=p.pp,
            ep=p.ep,
            pp_schedule=p.pp_schedule,
            microbatches=p.microbatches,
        )

    @property
    def ordered_batches(self) -> bool:
        """Whether the batches follow one seeded order that every worker reads (step checkpoints and
        elastic groups need the data position to be the step; accumulation takes its slices)."""
        resumable = self.run.checkpoint_every_steps is not None or self.scaling.elastic
        return resumable or self.optim.accumulate_steps > 1

    @property
    def global_slices(self) -> int:
        """Batches of ``optim.batch_size`` rows in a global batch: the full group's data ranks, times
        ``optim.accumulate_steps``."""
        return self.dims.data_world * self.optim.accumulate_steps

    @property
    def dims(self) -> ParallelDims:
        """The resolved parallel layout (``parallel.dp`` filled in from the workers; an elastic
        group's largest)."""
        return self.dims_at(self.scaling.num_workers)

    def _check_parallel_layout(self) -> None:
        """The layout's own rules (:class:`ParallelDims`), then what it asks of the model and the batch."""
        dims = self.dims
        if dims.ep_enabled:
            experts = self.model.experts if "ep" in self.model.capabilities.splits else None
            if experts is None:
                raise ValueError(
                    f"parallel.ep ({dims.ep}) needs MoE layers: "
                    f"model.name={either(family_names(lambda c: 'ep' in c.splits))} with experts"
                )
            if experts.num_experts % dims.ep:
                raise ValueError(
                    f"parallel.ep ({dims.ep}) must divide the number of experts ({experts.num_experts})"
                )
        if dims.model_split:
            self._check_model_parallel()

    def _check_model_parallel(self) -> None:
        parallel, model = self.parallel, self.model
        split = {
            name: getattr(parallel, name) for name in ("fsdp", "tp", "pp") if getattr(parallel, name) > 1
        }
        if model.experts is not None:
            raise ValueError(
                f"parallel.{next(iter(split))} needs a dense model; MoE layers split with parallel.ep"
            )
        for name, degree in split.items():
            if name not in model.capabilities.splits:
                able = either(family_names(lambda c, split=name: split in c.splits))
                raise ValueError(f"parallel.{name} ({degree}) needs model.name={able}, not {model.name}")
        if "tp" in split:  # tp | num_heads also gives tp | d_model (d_model is a multiple of num_heads)
            for field in ("num_heads", "ff_dim"):
                if getattr(model, field) % parallel.tp:
                    raise ValueError(
                        f"parallel.tp ({parallel.tp}) must divide model.{field} ({getattr(model, field)})"
                    )
        if "pp" in split:
            self._check_pipeline()

    def _check_pipeline(self) -> None:
        parallel, layers, batch = self.parallel, self.model.num_layers, self.optim.batch_size
        if parallel.pp > layers:
            raise ValueError(
                f"parallel.pp ({parallel.pp}) must be at most model.num_layers ({layers}): "
                "each pipeline stage holds whole layers"
            )
        if batch % parallel.microbatches:
            raise ValueError(
                f"parallel.microbatches ({parallel.microbatches}) must divide optim.batch_size ({batch})"
            )
