"""What a training epoch reports: the totals of its batches, the test pass, the console line."""

from typing import Any

import torch
import torch.nn.functional as F

from scaleforge.distributed.strategy import ParallelModel, WorkerBatches


def progress_line(metrics: dict[str, Any], epochs: int) -> str:
    """Rank 0's console line for an epoch."""
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
def evaluate(parallel: ParallelModel, data: WorkerBatches) -> torch.Tensor:
    """[loss sum, correct, count] on this rank's test batches (every rank runs the same number of
    forward passes: they are collective under expert and model parallelism)."""
    parallel.prepare_eval()
    parallel.module.eval()
    summed = torch.zeros(3, dtype=torch.float64)
    for x, y in data.test():
        logits = parallel.predict(x, data.eval_rows)
        if logits is not None:
            summed += totals(
                F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="sum").item(), logits, y
            )
    return summed


def totals(loss_sum: float, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[loss sum, correct, labels] of one batch: a label per example, or per token of a language model."""
    return torch.tensor([loss_sum, (logits.argmax(-1) == y).sum().item(), y.numel()], dtype=torch.float64)
