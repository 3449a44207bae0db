"""The loss curve of a training run, as a PNG next to its checkpoints."""

from typing import Any

from scaleforge import storage
from scaleforge.storage import write_atomic


def write_loss_curve(
    location: str, curve: list[dict[str, Any]], history: list[dict[str, Any]], steps_per_epoch: int
) -> str:
    """Plot the training loss every few steps and the validation loss after each epoch (with bits per
    byte on a second axis for a language model) to ``location`` (a path or URI); returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
