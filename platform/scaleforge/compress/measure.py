"""What every compressed model is judged by: weights, bytes on disk, CPU latency, and its quality
(test accuracy, or a language model's validation bits per byte)."""

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from scaleforge.storage import file_sizes


@dataclass
class StepRecord:
    """One model in the report: the teacher, a recipe step's output or a sweep point."""

    name: str
    step: str
    artifact: str
    parameters: int
    bytes: int
    metric: str
    """What ``score`` is: ``accuracy`` or ``bits_per_byte`` (see :mod:`scaleforge.data.in_memory`)."""
    score: float
    latency_ms: dict[int, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report's row: the score under its metric's name (``"accuracy": 0.98``)."""
        record = asdict(self)
        record[record.pop("metric")] = record.pop("score")
        record["latency_ms"] = {str(batch): ms for batch, ms in self.latency_ms.items()}
        return record


def folder_bytes(path: str | Path) -> int:
    """Bytes stored for an artifact, in a folder or under a URI.

    Counts the weights, the manifest, and an ONNX export beside them.
    """
    return sum(file_sizes(path).values())


def example_input(batch: int, input_dim: int, vocab: Optional[int] = None) -> torch.Tensor:
    """``batch`` random inputs as the model takes them: feature rows, or (with ``vocab``) a language
    model's windows of ``input_dim`` token ids."""
    if vocab is not None:
        return torch.randint(0, vocab, (batch, input_dim))
    return torch.randn(batch, input_dim)


@torch.inference_mode()
def latency_table(
    models: dict[str, nn.Module],
    input_dim: int,
    batch_sizes: list[int],
    repeats: int,
    threads: int,
    rounds: int = 5,
    vocab: Optional[int] = None,
) -> dict[str, dict[int, float]]:
    """Median forward time of every model per batch size, measured round-robin.

    Each of ``rounds`` rounds times every model in turn, so a burst of load from other
    processes lands on all models alike instead of on whichever was being measured; every
    model runs with the same ``threads`` intra-op threads. With ``vocab`` the inputs are windows
    of ``input_dim`` tokens (a language model's context as the data fills it).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    inputs = {batch: example_input(batch, input_dim, vocab) for batch in batch_sizes}
    times: dict[str, dict[int, list[float]]] = {name: {batch: [] for batch in batch_sizes} for name in models}
    try:
        for model in models.values():
            model.eval()
            for x in inputs.values():
                model(x)  # warm-up: allocator, packed-weight caches
        for _ in range(rounds):
            for name, model in models.items():
                for batch, x in inputs.items():
                    for _ in range(max(1, repeats // rounds)):
                        began = time.perf_counter()
                        model(x)
                        times[name][batch].append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(previous)
    return {
        name: {batch: statistics.median(samples) * 1e3 for batch, samples in per_batch.items()}
        for name, per_batch in times.items()
    }


def latency_ms(
    model: nn.Module, input_dim: int, batch_sizes: list[int], repeats: int, threads: int
) -> dict[int, float]:
    """Median forward time of one model per batch size (see :func:`latency_table`)."""
    return latency_table({"model": model}, input_dim, batch_sizes, repeats, threads)["model"]
