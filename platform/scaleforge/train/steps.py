"""An epoch step by step: gradient accumulation over an elastic group's slices, the step log, step
checkpoints, and the checkpoint that a preemption notice asks for before a node leaves."""

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConsistencyMode, CheckpointUploadMode

from scaleforge.distributed.checkpoint import write_trainer_state
from scaleforge.distributed.strategy import Batch, accumulate
from scaleforge.train.curves import log_curve_point
from scaleforge.train.metrics import totals
from scaleforge.train.position import EpochProgress, save_rng

if TYPE_CHECKING:
    from ray.train import PreemptionInfo

    from scaleforge.train.loop import Rank

_UPLOAD = {"sync": CheckpointUploadMode.SYNC, "async": CheckpointUploadMode.ASYNC}
_NO_DEADLINE_WAIT_S = 30.0
"""How long the workers wait for their node to go after a preemption notice without a deadline."""


def train_epoch(worker: "Rank", epoch: int) -> EpochProgress:
    """This rank's steps of ``epoch`` not yet run (all of them, unless a step checkpoint interrupted
    it): the epoch's totals, with the step log, step checkpoints and preemption checks on the way."""
    run, state = worker.run.job.run, worker.state
    start = state["epoch_step"] if epoch == worker.ctx.start_epoch else 0
    progress = worker.resumed if start else EpochProgress()
    worker.parallel.module.train()
    for index, slices in enumerate(worker.data.train(epoch, start), start):
        worker.ctx.step = state["step"]
        worker.hooks.on_step(worker.ctx, epoch, index)
        step_totals = _step(worker, slices, progress)
        state["step"], state["epoch_step"] = state["step"] + 1, index + 1
        progress.train += step_totals
        if worker.positional:
            _log_step(worker, epoch, step_totals, slices)
        if run.log_every_steps and state["step"] % run.log_every_steps == 0:
            progress.logged = log_curve_point(state, progress.train, progress.logged, worker.world)
        checkpointed = bool(run.checkpoint_every_steps) and state["step"] % run.checkpoint_every_steps == 0
        if checkpointed:
            checkpoint(worker, {"epoch": epoch + 1, "step": state["step"]}, progress)
        if notice := _preemption_notice(worker):
            _leave(worker, epoch, progress, notice, checkpointed)
    return progress


def _step(worker: "Rank", slices: list[Batch], progress: EpochProgress) -> torch.Tensor:
    """One optimiser step at the schedule's learning rate over this rank's slices of the global batch
    (several when an elastic group is below its full size: their gradients accumulate, weighted so
    that the step averages over the whole global batch); this rank's [loss sum, correct, labels]."""
    progress.lr = worker.schedule(worker.state["step"])
    for group in worker.optimizer.param_groups:
        group["lr"] = progress.lr
    worker.optimizer.zero_grad(set_to_none=True)
    summed = torch.zeros(3, dtype=torch.float64)
    for batch, (loss, logits) in zip(
        slices, accumulate(worker.parallel, slices, worker.loss_fn, worker.slices)
    ):
        if logits is not None:
            summed += totals(loss.item() * batch.y.numel(), logits, batch.y)
    if clip := worker.run.job.optim.clip_grad_norm:
        worker.parallel.clip_gradients(clip)
    worker.optimizer.step()
    return summed


def _log_step(worker: "Rank", epoch: int, step_totals: torch.Tensor, slices: list[Batch]) -> None:
    """Send the step log's line for the step just taken from rank 0 (collective: the loss and rows of
    the whole global batch, summed over the ranks that see their slices' logits)."""
    rows = sum(len(batch.y) for batch in slices) if worker.parallel.reports_metrics else 0
    summed = torch.tensor([step_totals[0], step_totals[2], rows], dtype=torch.float64)
    if worker.world > 1:
        dist.all_reduce(summed)  # a CPU tensor: on GPUs the group's CPU backend (gloo) carries it
    if worker.rank == 0:
        worker.run.progress.record(
            {
                "step": worker.state["step"],
                "epoch": epoch + 1,
                "loss": (summed[0] / summed[1]).item(),
                "global_batch": int(summed[2]),
                "workers": worker.world,
                "attempt_from_step": worker.ctx.start_step,
            }
        )


def checkpoint(
    worker: "Rank", metrics: dict[str, Any], progress: EpochProgress, upload: Optional[str] = None
) -> None:
    """Report ``metrics`` with a checkpoint (collective): the strategy's files, rank 0's trainer state
    and, with ordered batches, every rank's RNG state; uploaded as ``upload`` (default
    ``run.checkpoint_upload``) says, the local copy deleted once uploaded."""
    if worker.positional:
        worker.state["epoch_progress"] = progress.summed(worker.world)
    folder = Path(tempfile.mkdtemp(prefix="scaleforge-checkpoint-"))
    try:
        # Ray Train gathers every reporting rank's files into one checkpoint folder.
        writes = worker.parallel.save(folder, worker.optimizer)
        if worker.rank == 0:
            write_trainer_state(folder, worker.state)
        if worker.positional:
            save_rng(folder, worker.rank)
            writes = True
        if not (writes or worker.rank == 0):
            shutil.rmtree(folder)
        mode = _UPLOAD[upload or worker.run.job.run.checkpoint_upload]
        ray.train.report(
            metrics,
            checkpoint=Checkpoint.from_directory(folder) if folder.exists() else None,
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=True,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if mode is CheckpointUploadMode.SYNC:  # uploaded, or skipped (a report Ray dropped after a failure)
        shutil.rmtree(folder, ignore_errors=True)


def _preemption_notice(worker: "Rank") -> Optional["PreemptionInfo"]:
    """Ray Train's preemption notice, asked every ``run.preemption_check_every_steps`` of a run with
    ordered batches (collective: every rank asks at the same steps and gets rank 0's answer), until
    this attempt has had one."""
    every = worker.run.job.run.preemption_check_every_steps
    if not (every and worker.positional) or worker.noticed or worker.state["step"] % every:
        return None  # only ordered batches resume mid-epoch, from where the notice's checkpoint was taken
    return ray.train.get_preemption_info()


def _leave(worker: "Rank", epoch: int, progress: EpochProgress, notice, checkpointed: bool) -> None:
    """A node of the group is being drained: checkpoint now (unless this step just did), wait until it
    is stored, and take no step until Ray Train restarts the group without that node (at the
    deadline), so no step is lost."""
    worker.noticed = True
    step = worker.state["step"]
    deadline_s = notice.deadline_ms / 1000 if notice.deadline_ms else time.time() + _NO_DEADLINE_WAIT_S
    if worker.rank == 0:
        worker.run.progress.send(
            f"[preemption] ranks {notice.preempted_ranks} leave in {deadline_s - time.time():.1f} s: "
            f"checkpoint at step {step}, then no step until the group restarts",
            wait=True,
        )
    if not checkpointed:
        checkpoint(worker, {"epoch": epoch + 1, "step": step}, progress, upload="sync")
    ray.train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED, timeout_s=60)
    time.sleep(max(0.0, deadline_s - time.time()) + worker.run.job.run.preemption_wait_s)
