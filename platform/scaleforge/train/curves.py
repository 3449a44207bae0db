"""The loss curve of a training run: its points as the workers log them, and a PNG next to its checkpoints."""

from typing import Any

import torch
import torch.distributed as dist

from scaleforge import storage
from scaleforge.plots import pyplot
from scaleforge.storage import write_atomic


def write_loss_curve(
    location: str, curve: list[dict[str, Any]], history: list[dict[str, Any]], steps_per_epoch: int
) -> str:
    """Plot the training loss every few steps and the validation loss after each epoch (with bits per
    byte on a second axis for a language model) to ``location`` (a path or URI); returns it."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([p["step"] for p in curve], [p["train_loss"] for p in curve], label="training loss", lw=1)
    epochs = [h["epoch"] * steps_per_epoch for h in history]
    axis.plot(epochs, [h["test_loss"] for h in history], "o-", label="validation loss")
    axis.set_xlabel("optimiser step")
    axis.set_ylabel("cross-entropy (nats per token)" if "bits_per_byte" in history[-1] else "cross-entropy")
    if "bits_per_byte" in history[-1]:
        bits = axis.secondary_yaxis(
            "right",
            functions=(
                lambda n: n * history[-1]["bits_per_byte"] / history[-1]["test_loss"],
                lambda b: b * history[-1]["test_loss"] / history[-1]["bits_per_byte"],
            ),
        )
        bits.set_ylabel("bits per byte")
    axis.grid(alpha=0.3)
    axis.legend(loc="best")  # named: matplotlib warns on the console when a defaulted "best" takes over 1 s
    figure.tight_layout()
    write_atomic(location, lambda out: figure.savefig(out, format="png", dpi=100))
    plt.close(figure)
    return storage.describe(location) if storage.is_uri(location) else str(location)


def log_curve_point(
    state: dict[str, Any], train: torch.Tensor, logged: torch.Tensor, world: int
) -> torch.Tensor:
    """Append the mean training loss since the last point to ``state["curve"]`` (collective)."""
    interval = (train - logged)[[0, 2]].clone()
    if world > 1:
        dist.all_reduce(interval)
    if interval[1] > 0:
        state["curve"].append({"step": state["step"], "train_loss": (interval[0] / interval[1]).item()})
    return train.clone()
