"""The worker loop: what every Ray Train worker runs, whatever the parallelism.

Resumes from ``ray.train.get_checkpoint()`` when the worker group was restarted; reports metrics
every epoch and a checkpoint every ``run.checkpoint_every`` epochs.
"""

import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ray.train import Checkpoint

from scaleforge.distributed.checkpoint import read_trainer_state, write_trainer_state
from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.memory import MemoryReport, describe_memory, gather_memory, single_process_memory
from scaleforge.distributed.strategy import LossFn, ParallelModel, WorkerBatches, parallelize
from scaleforge.models import model_family
from scaleforge.progress import ProgressChannel
from scaleforge.train.hooks import Hooks, TrainHook, WorkerContext
from scaleforge.train.optim import Schedule, make_optimizer


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
class _Rank:
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


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: one rank of the run."""
    run: WorkerRun = config["run"]
    logging.getLogger("ray.train").setLevel(run.job.run.log_level)  # per-report INFO lines drown the progress
    context = ray.train.get_context()
    worker = _start(run, context.get_world_rank(), context.get_world_size())
    epochs = run.job.optim.epochs
    for epoch in range(worker.ctx.start_epoch, epochs):
        began = time.perf_counter()
        worker.hooks.on_epoch_start(worker.ctx, epoch)
        train, lr = _train_epoch(worker, epoch)
        metrics = _epoch_metrics(worker, epoch, train, lr, time.perf_counter() - began)
        worker.state["history"].append(metrics)
        worker.state["epoch"] = epoch
        if worker.rank == 0:
            run.progress.send(_progress(metrics, epochs))
        _report(metrics, worker.state, run.job.run, epochs, worker.rank, worker.parallel, worker.optimizer)


def _start(run: WorkerRun, rank: int, world: int) -> _Rank:
    """Build the model its family's way, split it, and resume from the latest checkpoint if any."""
    job, optim = run.job, run.job.optim
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(job.scaling.resources_per_worker.get("CPU", 1))))
    torch.manual_seed(optim.seed)
    family = model_family(job.model.name)
    model = family.build(job.model, run.info["input_dim"], run.info["num_classes"])
    reference = single_process_memory(model, optim.optimizer)
    parallel = parallelize(model, run.dims, family.plan, device, bf16=optim.precision == "bf16")
    optimizer = make_optimizer(parallel.module, optim)
    state = {"epoch": -1, "step": 0, "history": [], "memory": {}, "curve": []}
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as folder:
            parallel.load(Path(folder), optimizer)
            state = read_trainer_state(Path(folder))
    state["resumed_from_epoch"] = state["epoch"] + 1
    hooks = Hooks(run.hooks)
    columns = {"x": torch.int64 if run.info["tokens"] else torch.float32, "y": torch.int64, **hooks.columns}
    data = parallel.batches(optim.batch_size, optim.seed, run.info["num_train"], columns)
    ctx = WorkerContext(
        rank, world, state["resumed_from_epoch"], data.steps_per_epoch, parallel, run.progress
    )
    loss_fn = hooks.loss_fn(lambda batch: family.auxiliary_loss(parallel.module, batch))
    schedule = Schedule(optim, data.steps_per_epoch, parallel.data_world)
    return _Rank(run, rank, world, parallel, optimizer, state, hooks, data, schedule, ctx, loss_fn, reference)


def _train_epoch(worker: _Rank, epoch: int) -> tuple[torch.Tensor, float]:
    """One pass over this rank's training batches: [loss sum, correct, seen] and the last lr."""
    optim, every, state = worker.run.job.optim, worker.run.job.run.log_every_steps, worker.state
    worker.parallel.module.train()
    train, lr = torch.zeros(3, dtype=torch.float64), 0.0
    logged = train.clone()
    for index, batch in enumerate(worker.data.train(epoch)):
        worker.hooks.on_step(worker.ctx, epoch, index)
        lr = worker.schedule(state["step"])
        for group in worker.optimizer.param_groups:
            group["lr"] = lr
        worker.optimizer.zero_grad(set_to_none=True)
        loss, logits = worker.parallel.train_step(batch, worker.loss_fn)
        if optim.clip_grad_norm:
            worker.parallel.clip_gradients(optim.clip_grad_norm)
        worker.optimizer.step()
        state["step"] += 1
        if logits is not None:
            train += _totals(loss.item() * batch.y.numel(), logits, batch.y)
        if every and state["step"] % every == 0:
            logged = _log_curve(state, train, logged, worker.world)
    return train, lr


def _epoch_metrics(worker: _Rank, epoch: int, train: torch.Tensor, lr: float, seconds: float) -> dict:
    """The epoch's metrics, the same on every rank: training totals, a test pass, the hooks' own."""
    run, state, parallel = worker.run, worker.state, worker.parallel
    elapsed = torch.tensor([seconds])
    extra = worker.hooks.epoch_metrics(worker.ctx)  # before evaluation, which is no training
    if not state["memory"] and (held := parallel.memory(worker.optimizer)) is not None:
        state["memory"] = gather_memory(held, worker.reference)  # after the first step every state exists
        if worker.rank == 0:
            run.progress.send(describe_memory(state["memory"]))
    test = _evaluate(parallel, worker.data)
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
        "samples_per_s": train[2].item() / elapsed.item(),
        "epoch_s": elapsed.item(),
        "resumed_from_epoch": worker.ctx.start_epoch,
        **extra,
    }
    if run.info["tokens"]:  # a language model: its labels are tokens, and bytes are what users compare
        metrics.update(
            tokens_per_s=metrics.pop("samples_per_s"),
            bits_per_byte=metrics["test_loss"] / math.log(2) / run.info["bytes_per_token"],
        )
    return metrics


def _log_curve(state: dict[str, Any], train: torch.Tensor, logged: torch.Tensor, world: int) -> torch.Tensor:
    """Append the mean training loss since the last point to ``state["curve"]`` (collective)."""
    interval = (train - logged)[[0, 2]].clone()
    if world > 1:
        dist.all_reduce(interval)
    if interval[1] > 0:
        state["curve"].append({"step": state["step"], "train_loss": (interval[0] / interval[1]).item()})
    return train.clone()


def _progress(metrics: dict[str, Any], epochs: int) -> str:
    if "bits_per_byte" in metrics:
        quality, speed = (
            f"val_loss {metrics['test_loss']:.4f}  val bits/byte {metrics['bits_per_byte']:.3f}",
            f"{metrics['tokens_per_s']:,.0f} tokens/s",
        )
    else:
        quality, speed = (
            f"train_acc {metrics['train_accuracy']:.4f}  test_acc {metrics['test_accuracy']:.4f}",
            f"{metrics['samples_per_s']:,.0f} samples/s",
        )
    line = (
        f"[train] epoch {metrics['epoch']}/{epochs}  loss {metrics['train_loss']:.4f}  {quality}  "
        f"lr {metrics['lr']:.2e}  {speed}  ({metrics['epoch_s']:.1f}s)"
    )
    if "expert_load_cv" in metrics:
        line += (
            f"  expert load cv {metrics['expert_load_cv']:.3f} "
            f"dropped {metrics['expert_dropped_fraction']:.3f}"
        )
    return line


@torch.no_grad()
def _evaluate(parallel: ParallelModel, data: WorkerBatches) -> torch.Tensor:
    """[loss sum, correct, count] on this rank's test batches (every rank runs the same number of
    forward passes: they are collective under expert and model parallelism)."""
    parallel.prepare_eval()
    parallel.module.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    for x, y in data.test():
        logits = parallel.predict(x, data.eval_rows)
        if logits is not None:
            totals += _totals(
                F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="sum").item(), logits, y
            )
    return totals


def _totals(loss_sum: float, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[loss sum, correct, labels] of one batch: a label per example, or per token of a language model."""
    return torch.tensor([loss_sum, (logits.argmax(-1) == y).sum().item(), y.numel()], dtype=torch.float64)


def _report(metrics, state, run, epochs: int, rank: int, parallel: ParallelModel, optimizer) -> None:
    """Report the epoch's metrics, with a checkpoint every ``run.checkpoint_every`` epochs and after
    the last."""
    epoch = metrics["epoch"]
    if epoch % run.checkpoint_every and epoch != epochs:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        # Ray Train gathers every reporting rank's files into one checkpoint folder.
        writes = parallel.save(Path(folder), optimizer)
        if rank == 0:
            write_trainer_state(Path(folder), state)
        ray.train.report(
            metrics, checkpoint=Checkpoint.from_directory(folder) if writes or rank == 0 else None
        )
