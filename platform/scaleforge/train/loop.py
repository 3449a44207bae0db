"""The worker loop: what every Ray Train worker runs, whatever the parallelism.

Resumes from ``ray.train.get_checkpoint()`` when the worker group was restarted (on as many
workers as an elastic group has now); reports metrics every epoch and a checkpoint every
``run.checkpoint_every`` epochs and, with ``run.checkpoint_every_steps``, every that many steps too
(:mod:`scaleforge.train.steps`), from which the restarted run continues with the next unseen batch
(:mod:`scaleforge.train.position`).
"""

import logging
import math
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from scaleforge.distributed.checkpoint import read_trainer_state
from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.memory import MemoryReport, describe_memory, gather_memory, single_process_memory
from scaleforge.distributed.strategy import LossFn, ParallelModel, WorkerBatches, parallelize
from scaleforge.models import model_family
from scaleforge.models.compiled import compile_model
from scaleforge.models.recompute import set_activation_checkpointing
from scaleforge.progress import ProgressChannel
from scaleforge.train.hooks import Hooks, TrainHook, WorkerContext
from scaleforge.train.metrics import evaluate, progress_line
from scaleforge.train.optim import Schedule, make_optimizer
from scaleforge.train.position import EpochProgress, load_rng
from scaleforge.train.steps import checkpoint, train_epoch


@dataclass
class WorkerRun:
    """What the driver hands every worker (``train_loop_config["run"]``)."""

    job: Any
    """The validated ``TrainJobConfig``."""
    dims: ParallelDims
    info: dict[str, int]
    """``num_train``, ``input_dim``, ``num_classes`` of the dataset."""
    hooks: list[TrainHook]
    progress: ProgressChannel
    """Rank 0's progress lines go to the driver's console through it."""


@dataclass
class Rank:
    """One rank's attempt at the run: its part of the model and everything its epochs use."""

    run: WorkerRun
    rank: int
    world: int
    parallel: ParallelModel
    optimizer: torch.optim.Optimizer
    state: dict[str, Any]
    """Trainer state, checkpointed with the weights: epoch, step, history, memory, loss curve."""
    hooks: Hooks
    data: WorkerBatches
    schedule: Schedule
    ctx: WorkerContext
    loss_fn: LossFn
    reference: MemoryReport
    """What the unsplit model and its optimiser would hold in one process."""
    resumed: EpochProgress
    """The totals of the epoch a step checkpoint interrupted, restored from it (else zeros)."""
    noticed: bool = False
    """Whether this attempt has had its preemption notice (and checkpointed for it)."""

    @property
    def positional(self) -> bool:
        """Ordered batches: the data position is the step, checkpointed with every rank's RNG, and
        every step goes to the step log."""
        return self.run.job.ordered_batches

    @property
    def slices(self) -> int:
        """Slices of ``optim.batch_size`` rows in a global batch (``TrainJobConfig.global_slices``)."""
        return self.run.job.global_slices


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: one rank of the run."""
    run: WorkerRun = config["run"]
    logging.getLogger("ray.train").setLevel(run.job.run.log_level)  # per-report INFO lines drown the progress
    context = ray.train.get_context()
    worker = _start(run, context.get_world_rank(), context.get_world_size())
    epochs = run.job.optim.epochs
    for epoch in range(worker.ctx.start_epoch, epochs):
        worker.hooks.on_epoch_start(worker.ctx, epoch)
        progress = train_epoch(worker, epoch)
        metrics = _epoch_metrics(worker, epoch, progress)
        worker.state["history"].append(metrics)
        worker.state["epoch"], worker.state["epoch_step"] = epoch, 0
        if worker.rank == 0:
            run.progress.send(progress_line(metrics, epochs))
        if metrics["epoch"] % run.job.run.checkpoint_every and metrics["epoch"] != epochs:
            ray.train.report(metrics)
        else:
            checkpoint(worker, metrics, EpochProgress())


def _start(run: WorkerRun, rank: int, world: int) -> Rank:
    """Build the model its family's way, split it over this group's ``world`` ranks, and resume from
    the latest checkpoint if any."""
    job, optim = run.job, run.job.optim
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(job.scaling.resources_per_worker.get("CPU", 1))))
    torch.manual_seed(optim.seed)
    family = model_family(job.model.name)
    model = family.build(job.model, run.info["input_dim"], run.info["num_classes"])
    set_activation_checkpointing(model, job.parallel.activation_checkpointing)
    if job.run.compile:
        compile_model(model)
    reference = single_process_memory(model, optim.optimizer)
    dims = run.dims if world == run.dims.world_size else job.dims_at(world)  # an elastic group's size now
    parallel = parallelize(model, dims, family.plan, device, bf16=optim.precision == "bf16")
    optimizer = make_optimizer(parallel.module, optim)
    state = {"epoch": -1, "step": 0, "epoch_step": 0, "history": [], "memory": {}, "curve": []}
    if latest := ray.train.get_checkpoint():
        with latest.as_directory() as folder:
            parallel.load(Path(folder), optimizer)
            state = {**state, **read_trainer_state(Path(folder))}
            load_rng(Path(folder), rank)
    state["resumed_from_epoch"], state["resumed_from_step"] = state["epoch"] + 1, state["step"]
    hooks = Hooks(run.hooks)
    columns = {"x": torch.int64 if run.info["tokens"] else torch.float32, "y": torch.int64, **hooks.columns}
    slices = job.global_slices if job.ordered_batches else None
    data = parallel.batches(optim.batch_size, optim.seed, run.info["num_train"], columns, slices)
    ctx = WorkerContext(
        rank, world, state["resumed_from_epoch"], data.steps_per_epoch, parallel, run.progress, state["step"]
    )
    loss_fn = hooks.loss_fn(lambda batch: family.auxiliary_loss(parallel.module, batch))
    schedule = Schedule(optim, data.steps_per_epoch, job.global_slices)  # the full group's global batch
    resumed = EpochProgress.resumed(state, rank)
    return Rank(
        run, rank, world, parallel, optimizer, state, hooks, data, schedule, ctx, loss_fn, reference, resumed
    )


def _epoch_metrics(worker: Rank, epoch: int, progress: EpochProgress) -> dict:
    """The epoch's metrics, the same on every rank: training totals, a test pass, the hooks' own."""
    run, state, parallel = worker.run, worker.state, worker.parallel
    # The epoch's time and the peak resident memory of this worker's process (the fullest worker's, reduced)
    train, lr, elapsed = progress.train, progress.lr, torch.tensor([progress.elapsed(), _peak_rss()])
    extra = worker.hooks.epoch_metrics(worker.ctx)  # before evaluation, which is no training
    if not state["memory"] and (held := parallel.memory(worker.optimizer)) is not None:
        state["memory"] = gather_memory(held, worker.reference)  # after the first step every state exists
        if worker.rank == 0:
            run.progress.send(describe_memory(state["memory"]))
    test = evaluate(parallel, worker.data)
    if worker.world > 1:
        for totals in (train, test):
            dist.all_reduce(totals)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    metrics = {
        "epoch": epoch + 1,
        "train_loss": (train[0] / train[2]).item(),
        "train_accuracy": (train[1] / train[2]).item(),
        "test_loss": (test[0] / test[2]).item(),
        "test_accuracy": (test[1] / test[2]).item(),
        "lr": lr,
        "samples_per_s": train[2].item() / elapsed[0].item(),
        "epoch_s": elapsed[0].item(),
        "peak_rss_gib": elapsed[1].item() / 2**30,
        "resumed_from_epoch": worker.ctx.start_epoch,
        **extra,
    }
    if run.info["tokens"]:  # a language model: its labels are tokens, and bytes are what users compare
        metrics.update(
            tokens_per_s=metrics.pop("samples_per_s"),
            bits_per_byte=metrics["test_loss"] / math.log(2) / run.info["bytes_per_token"],
        )
    return metrics


def _peak_rss() -> float:
    """Bytes: the most this process has held in memory so far (``getrusage``'s maximum resident set)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux
